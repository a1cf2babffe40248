//! Container probes as the kubelet runs them, without IO: what each probe does, when it is due,
//! and what a sequence of results decides (started, ready, kill). Time is passed in as the time
//! since the container started; the IO lives in [`crate::prober`].
//!
//! The rules follow the kubelet's probe workers: a probe ticks every `periodSeconds` from the
//! container's start and skips ticks before `initialDelaySeconds`; a result only counts once it
//! repeats `successThreshold` (or `failureThreshold`) times in a row; while a startup probe has
//! not succeeded, liveness and readiness do not run; a liveness or startup result of failure
//! kills the container and stops probing that run. A container is started when it runs and its
//! startup probe (if any) succeeded, and ready when it is started and its readiness probe (if
//! any) last counted a success.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Defaults of the kubelet (and the API server's defaulting) for unset probe fields.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(10);
/// Default `timeoutSeconds`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default `successThreshold`.
pub const DEFAULT_SUCCESS_THRESHOLD: u32 = 1;
/// Default `failureThreshold`.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// `startupProbe`: gates the other two until it succeeds; failing kills the container.
    Startup,
    /// `livenessProbe`: failing kills the container.
    Liveness,
    /// `readinessProbe`: decides whether the container is ready.
    Readiness,
}

impl ProbeKind {
    /// The capitalised name the kubelet uses in event messages (`Readiness probe failed: ..`).
    pub fn title(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
        }
    }

    /// The lower-case name (`Container x failed liveness probe, will be restarted`).
    pub fn lower(self) -> &'static str {
        match self {
            Self::Startup => "startup",
            Self::Liveness => "liveness",
            Self::Readiness => "readiness",
        }
    }
}

/// A port as a probe names it: a number, or the name of one of the container's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRef {
    /// A port number.
    Number(u16),
    /// A named port of the container (`ports[].name`).
    Name(String),
}

/// `http` or `https` (the latter without certificate verification, as the kubelet does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTPS, certificate not verified.
    Https,
}

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Runs `command` inside the container; exit code 0 is success.
    Exec {
        /// Program and arguments (not run through a shell).
        command: Vec<String>,
    },
    /// Opens a TCP connection; connecting is success.
    TcpSocket {
        /// The host to connect to (default: the pod IP).
        host: Option<String>,
        /// The port.
        port: PortRef,
    },
    /// `GET`s a URL; a status from 200 to 399 is success.
    HttpGet {
        /// `http` or `https`.
        scheme: Scheme,
        /// The host to connect to (default: the pod IP).
        host: Option<String>,
        /// The port.
        port: PortRef,
        /// The request path (default `/`).
        path: String,
        /// Extra request headers, in order (a `Host` here sets the Host header).
        headers: Vec<(String, String)>,
    },
    /// Calls `grpc.health.v1.Health/Check`; `SERVING` is success.
    Grpc {
        /// The port (numbers only, as the API requires).
        port: u16,
        /// The service name sent in the request (empty: the server's overall health).
        service: String,
    },
    /// A probe the agent cannot run (the spec is invalid): every attempt fails with `reason`,
    /// as the kubelet fails a probe it cannot run.
    Invalid {
        /// What is wrong with the probe.
        reason: String,
    },
}

/// When a probe runs and how its results count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Ticks before this much time since the container started are skipped.
    pub initial_delay: Duration,
    /// Time between ticks.
    pub period: Duration,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// Consecutive successes before a success counts.
    pub success_threshold: u32,
    /// Consecutive failures before a failure counts.
    pub failure_threshold: u32,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            initial_delay: Duration::ZERO,
            period: DEFAULT_PERIOD,
            timeout: DEFAULT_TIMEOUT,
            success_threshold: DEFAULT_SUCCESS_THRESHOLD,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
        }
    }
}

/// One probe of a container, parsed and defaulted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// Which probe.
    pub kind: ProbeKind,
    /// What it does.
    pub action: Action,
    /// When it runs.
    pub timing: Timing,
    /// `terminationGracePeriodSeconds` of the probe: the grace of a kill it decides (liveness
    /// and startup only; `None`: the pod's).
    pub kill_grace: Option<Duration>,
}

/// Why a probe in the spec cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// No handler, or more than one.
    #[error(
        "{kind} probe of container {container:?} must set exactly one of exec, httpGet, \
         tcpSocket and grpc (found {found})"
    )]
    Handlers {
        /// Which probe.
        kind: &'static str,
        /// Which container.
        container: String,
        /// How many handlers it sets.
        found: usize,
    },
    /// A field is out of range.
    #[error("{kind} probe of container {container:?}: {message}")]
    Invalid {
        /// Which probe.
        kind: &'static str,
        /// Which container.
        container: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A named port that the container does not declare (or a port out of range).
    #[error(
        "port {port:?} is not a port number and no port of container {container:?} has that name"
    )]
    UnknownPort {
        /// The port as the probe names it.
        port: String,
        /// Which container.
        container: String,
    },
}

fn seconds(value: Option<i32>, default: Duration) -> Duration {
    value.map_or(default, |s| {
        Duration::from_secs(u64::try_from(s.max(0)).unwrap_or(0))
    })
}

fn port_ref(port: &IntOrString) -> Result<PortRef, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .map(PortRef::Number)
            .ok_or_else(|| format!("port {n} is not between 1 and 65535")),
        IntOrString::String(name) if name.is_empty() => Err("port must not be empty".to_owned()),
        IntOrString::String(name) => Ok(PortRef::Name(name.clone())),
    }
}

/// Parses and defaults one probe of `container` (the API server validates most of this; the
/// agent checks again because a hand-made pod may still carry nonsense).
pub fn probe_spec(
    kind: ProbeKind,
    probe: &Probe,
    container: &str,
) -> Result<ProbeSpec, ProbeError> {
    let invalid = |message: String| ProbeError::Invalid {
        kind: kind.lower(),
        container: container.to_owned(),
        message,
    };
    let mut actions = Vec::new();
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err(invalid("exec.command must not be empty".to_owned()));
        }
        actions.push(Action::Exec { command });
    }
    if let Some(tcp) = &probe.tcp_socket {
        actions.push(Action::TcpSocket {
            host: tcp.host.clone().filter(|h| !h.is_empty()),
            port: port_ref(&tcp.port).map_err(&invalid)?,
        });
    }
    if let Some(http) = &probe.http_get {
        let scheme = match http.scheme.as_deref().unwrap_or("HTTP") {
            "HTTP" => Scheme::Http,
            "HTTPS" => Scheme::Https,
            other => {
                return Err(invalid(format!(
                    "httpGet.scheme {other:?} is not HTTP or HTTPS"
                )));
            }
        };
        let path = match http.path.as_deref() {
            None | Some("") => "/".to_owned(),
            Some(p) if p.starts_with('/') => p.to_owned(),
            Some(p) => format!("/{p}"),
        };
        actions.push(Action::HttpGet {
            scheme,
            host: http.host.clone().filter(|h| !h.is_empty()),
            port: port_ref(&http.port).map_err(&invalid)?,
            path,
            headers: http
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        });
    }
    if let Some(grpc) = &probe.grpc {
        let port = u16::try_from(grpc.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                invalid(format!(
                    "grpc.port {} is not between 1 and 65535",
                    grpc.port
                ))
            })?;
        actions.push(Action::Grpc {
            port,
            service: grpc.service.clone().unwrap_or_default(),
        });
    }
    if actions.len() != 1 {
        return Err(ProbeError::Handlers {
            kind: kind.lower(),
            container: container.to_owned(),
            found: actions.len(),
        });
    }
    let threshold = |value: Option<i32>, default: u32, field: &str| {
        value.map_or(Ok(default), |v| {
            u32::try_from(v)
                .ok()
                .filter(|v| *v >= 1)
                .ok_or_else(|| invalid(format!("{field} {v} must be at least 1")))
        })
    };
    let success_threshold = threshold(
        probe.success_threshold,
        DEFAULT_SUCCESS_THRESHOLD,
        "successThreshold",
    )?;
    if kind != ProbeKind::Readiness && success_threshold != 1 {
        return Err(invalid(format!(
            "successThreshold {success_threshold} must be 1 for liveness and startup probes"
        )));
    }
    let period = seconds(probe.period_seconds, DEFAULT_PERIOD);
    if period.is_zero() {
        return Err(invalid("periodSeconds must be at least 1".to_owned()));
    }
    let timeout = seconds(probe.timeout_seconds, DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        return Err(invalid("timeoutSeconds must be at least 1".to_owned()));
    }
    Ok(ProbeSpec {
        kind,
        action: actions.remove(0),
        timing: Timing {
            initial_delay: seconds(probe.initial_delay_seconds, Duration::ZERO),
            period,
            timeout,
            success_threshold,
            failure_threshold: threshold(
                probe.failure_threshold,
                DEFAULT_FAILURE_THRESHOLD,
                "failureThreshold",
            )?,
        },
        kill_grace: probe
            .termination_grace_period_seconds
            .filter(|_| kind != ProbeKind::Readiness)
            .map(|s| Duration::from_secs(u64::try_from(s.max(0)).unwrap_or(0))),
    })
}

/// Every probe of `container`, startup first; a probe that cannot run keeps default timing and
/// an [`Action::Invalid`] naming what is wrong.
pub fn container_probes(container: &Container) -> Vec<ProbeSpec> {
    [
        (ProbeKind::Startup, &container.startup_probe),
        (ProbeKind::Liveness, &container.liveness_probe),
        (ProbeKind::Readiness, &container.readiness_probe),
    ]
    .into_iter()
    .filter_map(|(kind, probe)| {
        let probe = probe.as_ref()?;
        Some(
            probe_spec(kind, probe, &container.name).unwrap_or_else(|e| ProbeSpec {
                kind,
                action: Action::Invalid {
                    reason: e.to_string(),
                },
                timing: Timing::default(),
                kill_grace: None,
            }),
        )
    })
    .collect()
}

/// The port number `port` stands for in `container` (a name is looked up in its ports; a name
/// made of digits is a number, as the kubelet accepts it).
pub fn resolve_port(port: &PortRef, container: &Container) -> Result<u16, ProbeError> {
    match port {
        PortRef::Number(n) => Ok(*n),
        PortRef::Name(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .or_else(|| name.parse::<i32>().ok())
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| ProbeError::UnknownPort {
                port: name.clone(),
                container: container.name.clone(),
            }),
    }
}

/// What one probe attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The probe passed.
    Success,
    /// The probe failed; the text says why (it goes into the `Unhealthy` event).
    Failure(String),
}

/// What the agent must do after a probe result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Record an `Unhealthy` warning: `<Kind> probe failed: <message>` (every failed attempt,
    /// as the kubelet records; the event recorder counts repeats).
    Unhealthy {
        /// Which probe.
        kind: ProbeKind,
        /// Why it failed.
        message: String,
    },
    /// The container's `started` or `ready` changed: report the status.
    StatusChanged,
    /// Kill the container (liveness or startup failed past the threshold); probing stops for
    /// this run of the container.
    Kill {
        /// Which probe decided it.
        kind: ProbeKind,
        /// The probe's own grace period, if it sets one (else the pod's).
        grace: Option<Duration>,
    },
}

#[derive(Debug, Clone)]
struct Worker {
    spec: ProbeSpec,
    /// When the next attempt is due, since the container started.
    due: Duration,
    /// The last raw result and how many times in a row it came.
    last: Option<bool>,
    run: u32,
    /// The result that counts (after thresholds); `None` until one counts.
    result: Option<bool>,
}

impl Worker {
    /// The first tick at or after `at` that is not before the initial delay.
    fn tick_at_or_after(&self, at: Duration) -> Duration {
        let at = at.max(self.spec.timing.initial_delay);
        let period = self.spec.timing.period.as_nanos().max(1);
        let ticks = at.as_nanos().div_ceil(period);
        Duration::from_nanos(u64::try_from(ticks.saturating_mul(period)).unwrap_or(u64::MAX))
    }

    /// The first tick strictly after `at` (and not before the initial delay).
    fn tick_after(&self, at: Duration) -> Duration {
        let tick = self.tick_at_or_after(at);
        if tick > at {
            tick
        } else {
            self.tick_at_or_after(at + Duration::from_nanos(1))
        }
    }
}

/// The probes of one run of one container (a restarted container gets a fresh one, as the
/// kubelet resets its workers on a new container ID).
#[derive(Debug, Clone)]
pub struct ContainerProbes {
    workers: Vec<Worker>,
    killed: bool,
}

impl ContainerProbes {
    /// Probes for a container that just started (time zero).
    pub fn new(specs: Vec<ProbeSpec>) -> Self {
        let mut probes = Self {
            workers: specs
                .into_iter()
                .map(|spec| Worker {
                    spec,
                    due: Duration::ZERO,
                    last: None,
                    run: 0,
                    result: None,
                })
                .collect(),
            killed: false,
        };
        for w in &mut probes.workers {
            w.due = w.tick_at_or_after(Duration::ZERO);
        }
        probes
    }

    fn worker(&self, kind: ProbeKind) -> Option<&Worker> {
        self.workers.iter().find(|w| w.spec.kind == kind)
    }

    /// Whether the container counts as started: no startup probe, or it succeeded.
    pub fn started(&self) -> bool {
        self.worker(ProbeKind::Startup)
            .is_none_or(|w| w.result == Some(true))
    }

    /// Whether the container counts as ready: started, and no readiness probe or its counted
    /// result is success (it starts as failure, so a probed container is unready at first).
    pub fn ready(&self) -> bool {
        !self.killed
            && self.started()
            && self
                .worker(ProbeKind::Readiness)
                .is_none_or(|w| w.result == Some(true))
    }

    /// Whether probing stopped because a kill was decided.
    pub fn killed(&self) -> bool {
        self.killed
    }

    fn active(&self, w: &Worker) -> bool {
        // The startup probe runs until it succeeds, the others only after that.
        !self.killed && (w.spec.kind == ProbeKind::Startup) != self.started()
    }

    /// The probes with an attempt due at `now`, and when the next one after them is due.
    pub fn due(&self, now: Duration) -> Vec<&ProbeSpec> {
        self.workers
            .iter()
            .filter(|w| self.active(w) && w.due <= now)
            .map(|w| &w.spec)
            .collect()
    }

    /// When the earliest attempt is due (`None`: nothing will ever be probed again).
    pub fn next_due(&self) -> Option<Duration> {
        self.workers
            .iter()
            .filter(|w| self.active(w))
            .map(|w| w.due)
            .min()
    }

    /// Records the result of the attempt of `kind` that was due, ending at `now`; returns what
    /// the agent must do, in order.
    pub fn record(&mut self, kind: ProbeKind, outcome: &Outcome, now: Duration) -> Vec<Decision> {
        let mut decisions = Vec::new();
        let was = (self.started(), self.ready());
        let Some(index) = self.workers.iter().position(|w| w.spec.kind == kind) else {
            return decisions;
        };
        if !self.active(&self.workers[index]) {
            // A result that arrives after the probe stopped (startup passed, or killed).
            return decisions;
        }
        let worker = &mut self.workers[index];
        // Ticks keep their rhythm whenever an attempt ran; like Go's ticker, one tick that
        // passed while the attempt ran fires at once and any others are dropped.
        let next = worker.tick_after(worker.due);
        worker.due = if next <= now { now } else { next };
        let passed = matches!(outcome, Outcome::Success);
        if let Outcome::Failure(message) = outcome {
            decisions.push(Decision::Unhealthy {
                kind,
                message: message.clone(),
            });
        }
        if worker.last == Some(passed) {
            worker.run = worker.run.saturating_add(1);
        } else {
            worker.last = Some(passed);
            worker.run = 1;
        }
        let threshold = if passed {
            worker.spec.timing.success_threshold
        } else {
            worker.spec.timing.failure_threshold
        };
        if worker.run < threshold {
            return decisions;
        }
        worker.result = Some(passed);
        let grace = worker.spec.kill_grace;
        if !passed && kind != ProbeKind::Readiness {
            self.killed = true;
            decisions.push(Decision::Kill { kind, grace });
        }
        if kind == ProbeKind::Startup && passed {
            // The kubelet triggers readiness right away once the container started; liveness
            // waits for its next tick.
            for w in &mut self.workers {
                w.due = match w.spec.kind {
                    ProbeKind::Startup => w.due,
                    ProbeKind::Readiness => w.tick_at_or_after(Duration::ZERO).max(now),
                    ProbeKind::Liveness => w.tick_at_or_after(now),
                };
            }
        }
        if (self.started(), self.ready()) != was {
            decisions.push(Decision::StatusChanged);
        }
        decisions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(kind: ProbeKind, period: u64, delay: u64, success: u32, failure: u32) -> ProbeSpec {
        ProbeSpec {
            kind,
            action: Action::TcpSocket {
                host: None,
                port: PortRef::Number(80),
            },
            timing: Timing {
                initial_delay: Duration::from_secs(delay),
                period: Duration::from_secs(period),
                timeout: Duration::from_secs(1),
                success_threshold: success,
                failure_threshold: failure,
            },
            kill_grace: None,
        }
    }

    /// Runs the probes for `seconds`, answering each due attempt from `results` (per kind, in
    /// order; `+` success, `-` failure, the last one repeats), and writes one line per second
    /// in which something happened. Attempts take no time, and an attempt that falls due
    /// because of another's result runs in the same second, as the prober loops at once.
    fn simulate(specs: Vec<ProbeSpec>, results: &[(ProbeKind, &str)], seconds: u64) -> String {
        let mut probes = ContainerProbes::new(specs);
        let mut used: Vec<usize> = vec![0; results.len()];
        let mut out = String::new();
        for t in 0..=seconds {
            let now = Duration::from_secs(t);
            let mut line = Vec::new();
            for _round in 0..3 {
                let due: Vec<ProbeKind> = probes.due(now).iter().map(|s| s.kind).collect();
                if due.is_empty() {
                    break;
                }
                for kind in due {
                    let i = results
                        .iter()
                        .position(|(k, _)| *k == kind)
                        .expect("answers");
                    let script = results[i].1.as_bytes();
                    let c = script[used[i].min(script.len() - 1)];
                    used[i] += 1;
                    let outcome = if c == b'+' {
                        Outcome::Success
                    } else {
                        Outcome::Failure("refused".into())
                    };
                    line.push(format!("{}{}", kind.lower(), c as char));
                    for d in probes.record(kind, &outcome, now) {
                        match d {
                            Decision::Unhealthy { .. } => {}
                            Decision::StatusChanged => line.push(format!(
                                "started={} ready={}",
                                probes.started(),
                                probes.ready()
                            )),
                            Decision::Kill { kind, .. } => {
                                line.push(format!("KILL({})", kind.lower()))
                            }
                        }
                    }
                }
            }
            if !line.is_empty() {
                out.push_str(&format!("t={t:>2} {}\n", line.join(" ")));
            }
        }
        out
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let probe: Probe = serde_json::from_value(serde_json::json!({
            "httpGet": {"port": "http", "path": "healthz",
                        "httpHeaders": [{"name": "Host", "value": "example"}]}
        }))
        .expect("probe");
        let spec = probe_spec(ProbeKind::Liveness, &probe, "web").expect("valid");
        expect_test::expect![[r#"
            ProbeSpec {
                kind: Liveness,
                action: HttpGet {
                    scheme: Http,
                    host: None,
                    port: Name(
                        "http",
                    ),
                    path: "/healthz",
                    headers: [
                        (
                            "Host",
                            "example",
                        ),
                    ],
                },
                timing: Timing {
                    initial_delay: 0ns,
                    period: 10s,
                    timeout: 1s,
                    success_threshold: 1,
                    failure_threshold: 3,
                },
                kill_grace: None,
            }
        "#]]
        .assert_debug_eq(&spec);
    }

    #[test]
    fn bad_probes_are_named() {
        let cases = [
            serde_json::json!({}),
            serde_json::json!({"exec": {"command": ["true"]}, "tcpSocket": {"port": 1}}),
            serde_json::json!({"exec": {"command": []}}),
            serde_json::json!({"tcpSocket": {"port": 70000}}),
            serde_json::json!({"httpGet": {"port": 80, "scheme": "FTP"}}),
            serde_json::json!({"tcpSocket": {"port": 80}, "successThreshold": 2}),
            serde_json::json!({"tcpSocket": {"port": 80}, "failureThreshold": 0}),
            serde_json::json!({"tcpSocket": {"port": 80}, "periodSeconds": 0}),
        ];
        let errors: Vec<String> = cases
            .into_iter()
            .map(|c| {
                let probe: Probe = serde_json::from_value(c).expect("probe");
                probe_spec(ProbeKind::Liveness, &probe, "app")
                    .expect_err("invalid")
                    .to_string()
            })
            .collect();
        expect_test::expect![[r#"
            [
                "liveness probe of container \"app\" must set exactly one of exec, httpGet, tcpSocket and grpc (found 0)",
                "liveness probe of container \"app\" must set exactly one of exec, httpGet, tcpSocket and grpc (found 2)",
                "liveness probe of container \"app\": exec.command must not be empty",
                "liveness probe of container \"app\": port 70000 is not between 1 and 65535",
                "liveness probe of container \"app\": httpGet.scheme \"FTP\" is not HTTP or HTTPS",
                "liveness probe of container \"app\": successThreshold 2 must be 1 for liveness and startup probes",
                "liveness probe of container \"app\": failureThreshold 0 must be at least 1",
                "liveness probe of container \"app\": periodSeconds must be at least 1",
            ]
        "#]]
        .assert_debug_eq(&errors);
    }

    #[test]
    fn named_ports_resolve_from_the_container() {
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "web", "ports": [{"name": "http", "containerPort": 8080}]
        }))
        .expect("container");
        let resolve = |p: PortRef| resolve_port(&p, &container).map_err(|e| e.to_string());
        assert_eq!(resolve(PortRef::Name("http".into())), Ok(8080));
        assert_eq!(resolve(PortRef::Name("9090".into())), Ok(9090));
        assert_eq!(resolve(PortRef::Number(1)), Ok(1));
        assert_eq!(
            resolve(PortRef::Name("grpc".into())),
            Err(
                "port \"grpc\" is not a port number and no port of container \"web\" has that name"
                    .into()
            )
        );
    }

    #[test]
    fn readiness_starts_unready_and_follows_thresholds() {
        let got = simulate(
            vec![spec(ProbeKind::Readiness, 2, 3, 2, 3)],
            &[(ProbeKind::Readiness, "+++---+-++")],
            24,
        );
        expect_test::expect![[r#"
            t= 4 readiness+
            t= 6 readiness+ started=true ready=true
            t= 8 readiness+
            t=10 readiness-
            t=12 readiness-
            t=14 readiness- started=true ready=false
            t=16 readiness+
            t=18 readiness-
            t=20 readiness+
            t=22 readiness+ started=true ready=true
            t=24 readiness+
        "#]]
        .assert_eq(&got);
    }

    #[test]
    fn liveness_failure_past_threshold_kills_once() {
        let got = simulate(
            vec![
                spec(ProbeKind::Liveness, 1, 0, 1, 3),
                spec(ProbeKind::Readiness, 1, 0, 1, 1),
            ],
            &[
                (ProbeKind::Liveness, "++-+---"),
                (ProbeKind::Readiness, "+"),
            ],
            9,
        );
        expect_test::expect![[r#"
            t= 0 liveness+ readiness+ started=true ready=true
            t= 1 liveness+ readiness+
            t= 2 liveness- readiness+
            t= 3 liveness+ readiness+
            t= 4 liveness- readiness+
            t= 5 liveness- readiness+
            t= 6 liveness- KILL(liveness) started=true ready=false readiness+
        "#]]
        .assert_eq(&got);
    }

    #[test]
    fn startup_probe_gates_liveness_and_readiness() {
        let got = simulate(
            vec![
                spec(ProbeKind::Startup, 1, 0, 1, 10),
                spec(ProbeKind::Liveness, 3, 0, 1, 1),
                spec(ProbeKind::Readiness, 5, 0, 1, 1),
            ],
            &[
                (ProbeKind::Startup, "----+"),
                (ProbeKind::Liveness, "+"),
                (ProbeKind::Readiness, "+"),
            ],
            12,
        );
        expect_test::expect![[r#"
            t= 0 startup-
            t= 1 startup-
            t= 2 startup-
            t= 3 startup-
            t= 4 startup+ started=true ready=false readiness+ started=true ready=true
            t= 5 readiness+
            t= 6 liveness+
            t= 9 liveness+
            t=10 readiness+
            t=12 liveness+
        "#]]
        .assert_eq(&got);
    }

    #[test]
    fn startup_failure_past_threshold_kills() {
        let got = simulate(
            vec![
                spec(ProbeKind::Startup, 2, 1, 1, 3),
                spec(ProbeKind::Readiness, 1, 0, 1, 1),
            ],
            &[(ProbeKind::Startup, "-"), (ProbeKind::Readiness, "+")],
            12,
        );
        expect_test::expect![[r#"
            t= 2 startup-
            t= 4 startup-
            t= 6 startup- KILL(startup)
        "#]]
        .assert_eq(&got);
    }

    #[test]
    fn slow_attempts_drop_ticks() {
        let mut probes = ContainerProbes::new(vec![spec(ProbeKind::Liveness, 2, 0, 1, 3)]);
        let d = Duration::from_secs;
        assert_eq!(probes.next_due(), Some(d(0)));
        // Ticks at 0, 2, 4, 6..: an attempt from 0 to 5 leaves one tick pending (due at once),
        // and the rhythm goes on at 6.
        probes.record(ProbeKind::Liveness, &Outcome::Success, d(5));
        assert_eq!(probes.next_due(), Some(d(5)));
        probes.record(
            ProbeKind::Liveness,
            &Outcome::Success,
            d(5) + Duration::from_millis(10),
        );
        assert_eq!(probes.next_due(), Some(d(6)));
        // A quick attempt: the next tick. One that starts late (a busy runtime) keeps the rhythm.
        probes.record(
            ProbeKind::Liveness,
            &Outcome::Success,
            d(6) + Duration::from_millis(30),
        );
        assert_eq!(probes.next_due(), Some(d(8)));
    }

    #[test]
    fn no_probes_means_started_and_ready() {
        let probes = ContainerProbes::new(Vec::new());
        assert!(probes.started() && probes.ready());
        assert_eq!(probes.next_due(), None);
    }

    fn kinds() -> impl Strategy<Value = ProbeKind> {
        prop_oneof![
            Just(ProbeKind::Startup),
            Just(ProbeKind::Liveness),
            Just(ProbeKind::Readiness)
        ]
    }

    proptest! {
        /// Whatever the results: never ready before started, at most one kill and nothing after
        /// it, never a kill from readiness, every failure reported, and due times only move
        /// forward.
        #[test]
        fn invariants_hold(
            present in proptest::collection::btree_set(kinds(), 0..=3),
            period in 1u64..4,
            failure in 1u32..4,
            success in 1u32..3,
            steps in proptest::collection::vec((kinds(), any::<bool>()), 0..60),
        ) {
            let specs = present.iter().map(|k| {
                let s = if *k == ProbeKind::Readiness { success } else { 1 };
                spec(*k, period, 0, s, failure)
            }).collect();
            let mut probes = ContainerProbes::new(specs);
            let mut kills = 0;
            let mut now = Duration::ZERO;
            for (kind, ok) in steps {
                let due_before = probes.next_due();
                let was_active = probes.due(Duration::MAX).iter().any(|s| s.kind == kind);
                let outcome = if ok { Outcome::Success } else { Outcome::Failure("x".into()) };
                let decisions = probes.record(kind, &outcome, now);
                if !was_active {
                    prop_assert!(decisions.is_empty());
                }
                if was_active && !ok {
                    let reported = matches!(
                        decisions.first(),
                        Some(Decision::Unhealthy { kind: k, .. }) if *k == kind
                    );
                    prop_assert!(reported);
                }
                for d in &decisions {
                    if let Decision::Kill { kind, .. } = d {
                        prop_assert_ne!(*kind, ProbeKind::Readiness);
                        kills += 1;
                    }
                }
                prop_assert!(kills <= 1);
                prop_assert!(!probes.ready() || probes.started());
                if probes.killed() {
                    prop_assert_eq!(probes.next_due(), None);
                    prop_assert!(!probes.ready());
                }
                if let (Some(before), Some(after)) = (due_before, probes.next_due()) {
                    prop_assert!(after + Duration::from_secs(period) >= before);
                }
                now += Duration::from_secs(period);
            }
        }
    }
}
