//! Health state: each component reports healthy or unhealthy with a reason; `/healthz` is
//! healthy only when every registered component is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Shared, cloneable health registry.
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<Mutex<BTreeMap<String, Option<String>>>>,
}

impl Health {
    /// An empty registry (healthy: nothing registered is failing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `component` healthy.
    pub fn set_healthy(&self, component: &str) {
        self.lock().insert(component.to_owned(), None);
    }

    /// Marks `component` unhealthy with a human-readable reason.
    pub fn set_unhealthy(&self, component: &str, reason: impl Into<String>) {
        self.lock()
            .insert(component.to_owned(), Some(reason.into()));
    }

    /// `Ok(())` when all components are healthy, else one `component: reason` line each.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let failing: Vec<String> = self
            .lock()
            .iter()
            .filter_map(|(c, r)| r.as_ref().map(|r| format!("{c}: {r}")))
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<String>>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts).
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_component_is_reported_until_it_recovers() {
        let h = Health::new();
        assert!(h.check().is_ok());
        h.set_unhealthy("kernel", "nft failed");
        h.set_healthy("tunnel");
        assert_eq!(h.check(), Err(vec!["kernel: nft failed".to_owned()]));
        h.set_healthy("kernel");
        assert!(h.check().is_ok());
    }
}
