//! Pod status from the agent's view of its containers (pure: time is passed in).

use std::net::IpAddr;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Where one container is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerPhase {
    /// Not running: being created, backing off, or failing to start.
    Waiting {
        /// `ContainerCreating`, `CrashLoopBackOff`, `ErrImagePull`, `CreateContainerConfigError`..
        reason: String,
        /// Details for the user.
        message: Option<String>,
    },
    /// Running since `started_at`.
    Running {
        /// When the process started.
        started_at: Timestamp,
    },
    /// Exited and will not be restarted (or not yet).
    Terminated(Termination),
}

/// How a container run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Termination {
    /// Exit code (128 + signal when killed by a signal).
    pub exit_code: i32,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
    /// `Completed` or `Error`.
    pub reason: String,
    /// When it started.
    pub started_at: Timestamp,
    /// When it ended.
    pub finished_at: Timestamp,
    /// Runtime ID of that run.
    pub container_id: String,
}

impl Termination {
    fn to_state(&self) -> ContainerStateTerminated {
        ContainerStateTerminated {
            exit_code: self.exit_code,
            signal: self.signal,
            reason: Some(self.reason.clone()),
            started_at: Some(Time(self.started_at)),
            finished_at: Some(Time(self.finished_at)),
            container_id: Some(self.container_id.clone()),
            message: None,
        }
    }
}

/// The agent's record of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRecord {
    /// Container name.
    pub name: String,
    /// Image as the spec says.
    pub image: String,
    /// Current state.
    pub phase: ContainerPhase,
    /// Restarts so far.
    pub restart_count: i32,
    /// How the previous run ended.
    pub last_termination: Option<Termination>,
    /// Runtime ID of the current (or last) run.
    pub container_id: Option<String>,
    /// The current run passed its startup probe, or the container has none.
    pub startup_passed: bool,
    /// The current run's readiness probe counts a success, or the container has none.
    pub readiness_passed: bool,
}

impl ContainerRecord {
    /// A container that has not been started yet.
    pub fn new(name: &str, image: &str) -> Self {
        Self {
            name: name.to_owned(),
            image: image.to_owned(),
            phase: ContainerPhase::Waiting {
                reason: "ContainerCreating".to_owned(),
                message: None,
            },
            restart_count: 0,
            last_termination: None,
            container_id: None,
            startup_passed: true,
            readiness_passed: true,
        }
    }

    fn ever_started(&self) -> bool {
        self.restart_count > 0
            || self.last_termination.is_some()
            || !matches!(self.phase, ContainerPhase::Waiting { .. })
    }

    /// Running and past its startup probe (the kubelet's `started`).
    fn started(&self) -> bool {
        matches!(self.phase, ContainerPhase::Running { .. }) && self.startup_passed
    }

    /// Started and passing its readiness probe (the kubelet's `ready`).
    fn ready(&self) -> bool {
        self.started() && self.readiness_passed
    }
}

/// The agent's record of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRecord {
    /// `Always`, `OnFailure` or `Never`.
    pub restart_policy: String,
    /// The pod's address once its sandbox exists.
    pub pod_ip: Option<IpAddr>,
    /// The node's address.
    pub host_ip: String,
    /// When the agent accepted the pod.
    pub start_time: Timestamp,
    /// Init containers, in spec order (each runs to completion before the next).
    pub init_containers: Vec<ContainerRecord>,
    /// Containers, in spec order.
    pub containers: Vec<ContainerRecord>,
}

impl PodRecord {
    /// Whether every init container completed successfully.
    pub fn initialized(&self) -> bool {
        self.init_containers
            .iter()
            .all(|c| matches!(&c.phase, ContainerPhase::Terminated(t) if t.exit_code == 0))
    }

    /// Whether an init container failed for good (restartPolicy Never).
    pub fn init_failed(&self) -> bool {
        self.init_containers
            .iter()
            .any(|c| matches!(&c.phase, ContainerPhase::Terminated(t) if t.exit_code != 0))
    }
}

/// The pod phase, following the kubelet's rules.
pub fn phase(pod: &PodRecord) -> &'static str {
    if pod.init_failed() {
        return "Failed";
    }
    let containers = &pod.containers;
    if containers.is_empty() || !pod.initialized() {
        return "Pending";
    }
    if containers
        .iter()
        .any(|c| matches!(c.phase, ContainerPhase::Running { .. }))
    {
        return "Running";
    }
    let terminated: Vec<&Termination> = containers
        .iter()
        .filter_map(|c| match &c.phase {
            ContainerPhase::Terminated(t) => Some(t),
            _ => None,
        })
        .collect();
    if terminated.len() == containers.len() {
        let all_ok = terminated.iter().all(|t| t.exit_code == 0);
        return match (pod.restart_policy.as_str(), all_ok) {
            ("Always", _) => "Running",
            (_, true) => "Succeeded",
            (_, false) => "Failed",
        };
    }
    if containers.iter().any(ContainerRecord::ever_started) && pod.restart_policy != "Never" {
        // Backing off between restarts: the pod has run and will run again.
        return "Running";
    }
    "Pending"
}

/// The full status at `now`. `previous` keeps condition transition times that did not change.
pub fn pod_status(pod: &PodRecord, previous: Option<&PodStatus>, now: Timestamp) -> PodStatus {
    let phase = phase(pod);
    let all_ready = !pod.containers.is_empty() && pod.containers.iter().all(ContainerRecord::ready);
    let not_ready: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| !c.ready())
        .map(|c| c.name.as_str())
        .collect();
    let ready_condition = |kind: &str| {
        if all_ready || phase == "Succeeded" {
            let reason = (phase == "Succeeded").then(|| "PodCompleted".to_owned());
            (
                kind.to_owned(),
                if phase == "Succeeded" {
                    "False"
                } else {
                    "True"
                },
                reason,
                None,
            )
        } else {
            (
                kind.to_owned(),
                "False",
                Some("ContainersNotReady".to_owned()),
                Some(format!(
                    "containers with unready status: [{}]",
                    not_ready.join(" ")
                )),
            )
        }
    };
    let wanted = [
        (
            "PodReadyToStartContainers".to_owned(),
            if pod.pod_ip.is_some() {
                "True"
            } else {
                "False"
            },
            None,
            None,
        ),
        if pod.initialized() {
            ("Initialized".to_owned(), "True", None, None)
        } else {
            let incomplete: Vec<&str> = pod
                .init_containers
                .iter()
                .filter(|c| !matches!(&c.phase, ContainerPhase::Terminated(t) if t.exit_code == 0))
                .map(|c| c.name.as_str())
                .collect();
            (
                "Initialized".to_owned(),
                "False",
                Some("ContainersNotInitialized".to_owned()),
                Some(format!(
                    "containers with incomplete status: [{}]",
                    incomplete.join(" ")
                )),
            )
        },
        ready_condition("Ready"),
        ready_condition("ContainersReady"),
        ("PodScheduled".to_owned(), "True", None, None),
    ];
    let conditions = wanted
        .into_iter()
        .map(|(kind, status, reason, message)| {
            let old = previous
                .and_then(|p| p.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == kind));
            let transition = match old {
                Some(c) if c.status == status => c.last_transition_time.clone(),
                _ => None,
            };
            PodCondition {
                type_: kind,
                status: status.to_owned(),
                reason,
                message,
                last_transition_time: transition.or(Some(Time(now))),
                ..PodCondition::default()
            }
        })
        .collect();
    let container_statuses = pod.containers.iter().map(container_status).collect();
    let init_statuses: Vec<ContainerStatus> = pod
        .init_containers
        .iter()
        .map(|c| ContainerStatus {
            ready: matches!(&c.phase, ContainerPhase::Terminated(t) if t.exit_code == 0),
            ..container_status(c)
        })
        .collect();
    let pod_ip = pod.pod_ip.map(|ip| ip.to_string());
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        host_ip: Some(pod.host_ip.clone()),
        host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP {
            ip: pod.host_ip.clone(),
        }]),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        start_time: Some(Time(pod.start_time)),
        container_statuses: Some(container_statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        qos_class: previous.and_then(|p| p.qos_class.clone()),
        ..PodStatus::default()
    }
}

fn container_status(c: &ContainerRecord) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: format!("simkube://{}", c.image),
        container_id: c.container_id.clone(),
        ready: c.ready(),
        started: Some(c.started()),
        restart_count: c.restart_count,
        state: Some(state_of(&c.phase)),
        last_state: Some(
            c.last_termination
                .as_ref()
                .map_or_else(ContainerState::default, |t| ContainerState {
                    terminated: Some(t.to_state()),
                    ..ContainerState::default()
                }),
        ),
        ..ContainerStatus::default()
    }
}

fn state_of(phase: &ContainerPhase) -> ContainerState {
    match phase {
        ContainerPhase::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..ContainerState::default()
        },
        ContainerPhase::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..ContainerState::default()
        },
        ContainerPhase::Terminated(t) => ContainerState {
            terminated: Some(t.to_state()),
            ..ContainerState::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    fn term(code: i32) -> Termination {
        Termination {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            started_at: ts("2026-01-01T00:00:00Z"),
            finished_at: ts("2026-01-01T00:00:01Z"),
            container_id: "simkube://u-c-0".into(),
        }
    }

    fn pod(policy: &str, phases: Vec<ContainerPhase>) -> PodRecord {
        PodRecord {
            restart_policy: policy.into(),
            pod_ip: Some(IpAddr::from([10, 244, 1, 2])),
            host_ip: "198.18.0.2".into(),
            start_time: ts("2026-01-01T00:00:00Z"),
            init_containers: Vec::new(),
            containers: phases
                .into_iter()
                .enumerate()
                .map(|(i, p)| ContainerRecord {
                    phase: p,
                    ..ContainerRecord::new(&format!("c{i}"), "img")
                })
                .collect(),
        }
    }

    #[test]
    fn phases_follow_the_kubelet() {
        let running = ContainerPhase::Running {
            started_at: ts("2026-01-01T00:00:00Z"),
        };
        let waiting = |r: &str| ContainerPhase::Waiting {
            reason: r.into(),
            message: None,
        };
        let done = |c| ContainerPhase::Terminated(term(c));
        let cases = [
            ("Always", vec![waiting("ContainerCreating")]),
            ("Always", vec![running.clone(), waiting("ErrImagePull")]),
            ("Always", vec![done(0)]),
            ("Never", vec![done(0), done(0)]),
            ("Never", vec![done(0), done(3)]),
            ("OnFailure", vec![done(0)]),
            ("Never", vec![done(0), running]),
            ("Always", vec![]),
        ];
        let got: Vec<String> = cases
            .into_iter()
            .map(|(policy, phases)| {
                format!(
                    "{policy} {} => {}",
                    phases.len(),
                    phase(&pod(policy, phases))
                )
            })
            .collect();
        expect_test::expect![[r#"
            [
                "Always 1 => Pending",
                "Always 2 => Running",
                "Always 1 => Running",
                "Never 2 => Succeeded",
                "Never 2 => Failed",
                "OnFailure 1 => Succeeded",
                "Never 2 => Running",
                "Always 0 => Pending",
            ]
        "#]]
        .assert_debug_eq(&got);
    }

    #[test]
    fn init_containers_gate_the_pod() {
        let mut p = pod(
            "Never",
            vec![ContainerPhase::Waiting {
                reason: "PodInitializing".into(),
                message: None,
            }],
        );
        p.init_containers = vec![ContainerRecord::new("setup", "img")];
        let status = pod_status(&p, None, ts("2026-01-01T00:00:05Z"));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let init = status
            .conditions
            .as_ref()
            .and_then(|c| c.iter().find(|c| c.type_ == "Initialized"))
            .expect("Initialized");
        assert_eq!(init.status, "False");
        assert_eq!(
            init.message.as_deref(),
            Some("containers with incomplete status: [setup]")
        );
        p.init_containers[0].phase = ContainerPhase::Terminated(term(0));
        assert!(p.initialized());
        let status = pod_status(&p, None, ts("2026-01-01T00:00:05Z"));
        assert!(status.init_container_statuses.expect("init statuses")[0].ready);
        p.init_containers[0].phase = ContainerPhase::Terminated(term(2));
        assert_eq!(phase(&p), "Failed");
    }

    #[test]
    fn crash_looping_container_keeps_pod_running_with_last_state() {
        let mut p = pod(
            "Always",
            vec![ContainerPhase::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some("back-off 10s".into()),
            }],
        );
        p.containers[0].restart_count = 2;
        p.containers[0].last_termination = Some(term(1));
        let status = pod_status(&p, None, ts("2026-01-01T00:00:05Z"));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let cs = &status.container_statuses.expect("statuses")[0];
        assert_eq!(cs.restart_count, 2);
        assert!(!cs.ready);
        let waiting = cs
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .expect("waiting");
        assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
        let last = cs
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("last");
        assert_eq!(last.exit_code, 1);
    }

    #[test]
    fn probes_gate_started_and_ready() {
        let running = ContainerPhase::Running {
            started_at: ts("2026-01-01T00:00:00Z"),
        };
        let mut p = pod("Always", vec![running.clone(), running]);
        let summary = |p: &PodRecord| {
            let status = pod_status(p, None, ts("2026-01-01T00:00:05Z"));
            let containers: Vec<String> = status
                .container_statuses
                .iter()
                .flatten()
                .map(|c| format!("{} started={:?} ready={}", c.name, c.started, c.ready))
                .collect();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .filter(|c| c.type_ == "Ready" || c.type_ == "ContainersReady")
                .map(|c| format!("{}={} {:?}", c.type_, c.status, c.message))
                .collect::<Vec<_>>();
            format!("{containers:?} {ready:?}")
        };
        p.containers[0].startup_passed = false;
        p.containers[0].readiness_passed = false;
        p.containers[1].readiness_passed = false;
        let waiting_for_startup = summary(&p);
        p.containers[0].startup_passed = true;
        let started_unready = summary(&p);
        p.containers[0].readiness_passed = true;
        p.containers[1].readiness_passed = true;
        let all_ready = summary(&p);
        expect_test::expect![[r#"["c0 started=Some(false) ready=false", "c1 started=Some(true) ready=false"] ["Ready=False Some(\"containers with unready status: [c0 c1]\")", "ContainersReady=False Some(\"containers with unready status: [c0 c1]\")"]"#]].assert_eq(&waiting_for_startup);
        expect_test::expect![[r#"["c0 started=Some(true) ready=false", "c1 started=Some(true) ready=false"] ["Ready=False Some(\"containers with unready status: [c0 c1]\")", "ContainersReady=False Some(\"containers with unready status: [c0 c1]\")"]"#]].assert_eq(&started_unready);
        expect_test::expect![[r#"["c0 started=Some(true) ready=true", "c1 started=Some(true) ready=true"] ["Ready=True None", "ContainersReady=True None"]"#]].assert_eq(&all_ready);
    }

    #[test]
    fn ready_pod_status_snapshot_and_stable_transitions() {
        let p = pod(
            "Always",
            vec![ContainerPhase::Running {
                started_at: ts("2026-01-01T00:00:00Z"),
            }],
        );
        let first = pod_status(&p, None, ts("2026-01-01T00:00:01Z"));
        let again = pod_status(&p, Some(&first), ts("2026-01-01T00:09:00Z"));
        assert_eq!(first, again, "nothing changed, so nothing moves");
        expect_test::expect![[r#"
            {
              "conditions": [
                {
                  "lastTransitionTime": "2026-01-01T00:00:01Z",
                  "status": "True",
                  "type": "PodReadyToStartContainers"
                },
                {
                  "lastTransitionTime": "2026-01-01T00:00:01Z",
                  "status": "True",
                  "type": "Initialized"
                },
                {
                  "lastTransitionTime": "2026-01-01T00:00:01Z",
                  "status": "True",
                  "type": "Ready"
                },
                {
                  "lastTransitionTime": "2026-01-01T00:00:01Z",
                  "status": "True",
                  "type": "ContainersReady"
                },
                {
                  "lastTransitionTime": "2026-01-01T00:00:01Z",
                  "status": "True",
                  "type": "PodScheduled"
                }
              ],
              "containerStatuses": [
                {
                  "image": "img",
                  "imageID": "simkube://img",
                  "lastState": {},
                  "name": "c0",
                  "ready": true,
                  "restartCount": 0,
                  "started": true,
                  "state": {
                    "running": {
                      "startedAt": "2026-01-01T00:00:00Z"
                    }
                  }
                }
              ],
              "hostIP": "198.18.0.2",
              "hostIPs": [
                {
                  "ip": "198.18.0.2"
                }
              ],
              "phase": "Running",
              "podIP": "10.244.1.2",
              "podIPs": [
                {
                  "ip": "10.244.1.2"
                }
              ],
              "startTime": "2026-01-01T00:00:00Z"
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&first).expect("json"));
    }
}
