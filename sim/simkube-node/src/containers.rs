//! The registry of running containers, shared by the parts that must reach a container after it
//! started: the kubelet endpoint (`exec`, `attach`) and the prober (exec probes).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Which container: the pod's namespace and name, and the container's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerKey {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
}

impl ContainerKey {
    /// The key of `container` in pod `namespace/pod`.
    pub fn new(namespace: &str, pod: &str, container: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            container: container.to_owned(),
        }
    }
}

/// What a new process in a running container needs: its namespaces (through the main
/// process's PID and the pod's network namespace), environment and working directory.
#[derive(Clone)]
pub struct RunningContainer {
    /// The pod's UID (a pod recreated under the same name is another pod).
    pub pod_uid: String,
    /// The container's main process; `/proc/<pid>/ns/*` are its namespaces.
    pub pid: u32,
    /// The pod's network namespace file.
    pub netns: PathBuf,
    /// The container's complete environment (values may be secrets: never logged).
    pub env: Vec<(String, String)>,
    /// The container's working directory.
    pub working_dir: PathBuf,
}

impl std::fmt::Debug for RunningContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The environment may hold secrets from `secretKeyRef`: only its names are shown.
        let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("RunningContainer")
            .field("pod_uid", &self.pod_uid)
            .field("pid", &self.pid)
            .field("netns", &self.netns)
            .field("env", &names)
            .field("working_dir", &self.working_dir)
            .finish()
    }
}

/// The containers running on this node, by key.
#[derive(Debug, Clone, Default)]
pub struct Containers(Arc<Mutex<HashMap<ContainerKey, RunningContainer>>>);

impl Containers {
    /// Records that `key` runs as `running` (replacing an earlier run).
    pub fn insert(&self, key: ContainerKey, running: RunningContainer) {
        self.lock().insert(key, running);
    }

    /// Forgets `key` if its main process is still `pid` (a newer run stays).
    pub fn remove(&self, key: &ContainerKey, pid: u32) {
        let mut map = self.lock();
        if map.get(key).is_some_and(|r| r.pid == pid) {
            map.remove(key);
        }
    }

    /// The running container `key`, if any.
    pub fn get(&self, key: &ContainerKey) -> Option<RunningContainer> {
        self.lock().get(key).cloned()
    }

    /// A running container of pod `namespace/pod` (they share the pod's network namespace).
    pub fn of_pod(&self, namespace: &str, pod: &str) -> Option<RunningContainer> {
        self.lock()
            .iter()
            .find(|(k, _)| k.namespace == namespace && k.pod == pod)
            .map(|(_, r)| r.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerKey, RunningContainer>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(pid: u32) -> RunningContainer {
        RunningContainer {
            pod_uid: "u".into(),
            pid,
            netns: "/run/netns/x".into(),
            env: vec![("TOKEN".into(), "s3cret".into())],
            working_dir: "/".into(),
        }
    }

    #[test]
    fn a_stale_removal_keeps_the_newer_run() {
        let containers = Containers::default();
        let key = ContainerKey::new("ns", "p", "c");
        containers.insert(key.clone(), running(10));
        containers.insert(key.clone(), running(11));
        containers.remove(&key, 10);
        assert_eq!(containers.get(&key).map(|r| r.pid), Some(11));
        containers.remove(&key, 11);
        assert!(containers.get(&key).is_none());
    }

    #[test]
    fn debug_output_hides_environment_values() {
        let shown = format!("{:?}", running(1));
        assert!(shown.contains("TOKEN"));
        assert!(!shown.contains("s3cret"));
    }
}
