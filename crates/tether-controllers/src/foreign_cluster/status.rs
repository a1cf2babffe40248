//! Pure summaries for a ForeignCluster's status.

use tether_api::core::Role;

/// What the remote cluster is to this one, from the two directions.
pub fn role(this_consumes: bool, remote_consumes: bool) -> Role {
    match (this_consumes, remote_consumes) {
        (true, true) => Role::ConsumerAndProvider,
        (true, false) => Role::Provider,
        (false, true) => Role::Consumer,
        (false, false) => Role::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_names_what_the_remote_is() {
        assert_eq!(role(true, false), Role::Provider);
        assert_eq!(role(false, true), Role::Consumer);
        assert_eq!(role(true, true), Role::ConsumerAndProvider);
        assert_eq!(role(false, false), Role::Unknown);
    }
}
