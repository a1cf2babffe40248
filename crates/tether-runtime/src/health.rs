//! Health and readiness state. Each component reports a state with a reason; `/healthz` is
//! healthy only when every registered component is healthy, and `/readyz` is ready only when
//! every registered component is ready. A component that registers starts not ready, so a
//! daemon is never reported ready before its parts have said so.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Component name → `None` when fine, else the reason it is not.
#[derive(Clone, Debug, Default)]
struct Components {
    inner: Arc<Mutex<BTreeMap<String, Option<String>>>>,
}

impl Components {
    fn set(&self, component: &str, reason: Option<String>) {
        self.lock().insert(component.to_owned(), reason);
    }

    fn check(&self) -> Result<(), Vec<String>> {
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

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Option<String>>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts).
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Shared, cloneable health registry (liveness: is the process working at all?).
#[derive(Clone, Debug, Default)]
pub struct Health {
    components: Components,
}

impl Health {
    /// An empty registry (healthy: nothing registered is failing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `component` healthy.
    pub fn set_healthy(&self, component: &str) {
        self.components.set(component, None);
    }

    /// Marks `component` unhealthy with a human-readable reason.
    pub fn set_unhealthy(&self, component: &str, reason: impl Into<String>) {
        self.components.set(component, Some(reason.into()));
    }

    /// `Ok(())` when all components are healthy, else one `component: reason` line each.
    pub fn check(&self) -> Result<(), Vec<String>> {
        self.components.check()
    }
}

/// Shared, cloneable readiness registry (should this process get work: is it synced, does it
/// lead?). Components register not ready and flip as their state changes.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    components: Components,
}

impl Readiness {
    /// An empty registry (ready: nothing registered is waiting).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `component` as not ready yet, with the reason (e.g. `caches not synced`).
    pub fn register(&self, component: &str, reason: impl Into<String>) {
        self.set_not_ready(component, reason);
    }

    /// Marks `component` ready.
    pub fn set_ready(&self, component: &str) {
        self.components.set(component, None);
    }

    /// Marks `component` not ready with a human-readable reason.
    pub fn set_not_ready(&self, component: &str, reason: impl Into<String>) {
        self.components.set(component, Some(reason.into()));
    }

    /// `Ok(())` when all components are ready, else one `component: reason` line each.
    pub fn check(&self) -> Result<(), Vec<String>> {
        self.components.check()
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

    #[test]
    fn readiness_needs_every_registered_component() {
        let r = Readiness::new();
        assert!(r.check().is_ok(), "nothing registered, nothing to wait for");
        r.register("caches", "not synced");
        r.register("leader", "standby");
        assert_eq!(
            r.check(),
            Err(vec![
                "caches: not synced".to_owned(),
                "leader: standby".to_owned()
            ])
        );
        r.set_ready("caches");
        assert_eq!(r.check(), Err(vec!["leader: standby".to_owned()]));
        r.set_ready("leader");
        assert!(r.check().is_ok());
        r.set_not_ready("leader", "lease lost");
        assert_eq!(r.check(), Err(vec!["leader: lease lost".to_owned()]));
    }

    #[test]
    fn clones_share_state() {
        let r = Readiness::new();
        let other = r.clone();
        other.register("caches", "not synced");
        assert!(r.check().is_err());
    }
}
