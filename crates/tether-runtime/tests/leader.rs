//! Leader election against an in-process simkube: one leader among candidates, hand-over on
//! release, and a leader that cannot renew gives up before anyone else may take over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use prometheus_client::registry::Registry;
use tether_runtime::{LeaderElector, LeaseParams, Shutdown};
use tokio::time::Instant;

const NS: &str = "default";
const LEASE: &str = "tether-controller";

/// Short timings so the tests run in seconds; the same ratios as the defaults.
fn params() -> LeaseParams {
    LeaseParams {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_millis(2000),
        retry_period: Duration::from_millis(250),
    }
}

async fn cluster() -> simkube::Cluster {
    simkube::Cluster::builder().start().await.expect("cluster")
}

fn elector(client: kube::Client, identity: &str) -> LeaderElector {
    LeaderElector::new(client, NS, LEASE, identity, params()).expect("valid params")
}

async fn holder(client: &kube::Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), NS)
        .get(LEASE)
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity)
}

/// A client whose connection to the server can be cut: requests fail as a refused connection
/// would, while the server keeps serving everyone else.
fn cuttable_client(cluster: &simkube::Cluster) -> (kube::Client, Arc<AtomicBool>) {
    use tower::ServiceExt as _;
    let cut = Arc::new(AtomicBool::new(false));
    let router = cluster.service();
    let flag = cut.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let router = router.clone();
        let cut = flag.load(Ordering::SeqCst);
        async move {
            if cut {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            }
            router
                .oneshot(req.map(axum::body::Body::new))
                .await
                .map_err(|never| match never {})
        }
    });
    (kube::Client::new(service, NS), cut)
}

#[tokio::test]
async fn exactly_one_of_three_candidates_leads() {
    let cluster = cluster().await;
    let shutdown = Shutdown::new();
    let electors: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|id| elector(cluster.client(), id))
        .collect();
    let mut tasks = Vec::new();
    for e in &electors {
        let (e, shutdown) = (e.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move { e.acquire(&shutdown).await }));
    }
    // The lease duration is 3 s: twice that gives any second winner every chance to appear.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let leading: Vec<_> = electors.iter().filter(|e| e.is_leader()).collect();
    assert_eq!(leading.len(), 1, "{electors:?}");
    let leader = leading[0].identity().to_owned();
    assert_eq!(
        holder(&cluster.client()).await.as_deref(),
        Some(leader.as_str())
    );
    let finished: Vec<_> = tasks.iter().filter(|t| t.is_finished()).collect();
    assert_eq!(finished.len(), 1, "only the leader's acquire returned");

    for e in &electors {
        let mut sub = Registry::default();
        e.register_metrics(&mut sub);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &sub).expect("encode");
        let expected = if e.identity() == leader { 1 } else { 0 };
        assert!(text.contains(&format!("leader {expected}")), "{text}");
    }

    shutdown.trigger();
    for t in tasks {
        let leadership = t.await.expect("join");
        if let Some(l) = leadership {
            assert!(!l.is_lost(), "renewals kept it");
            l.release().await.expect("release");
        }
    }
    cluster.shutdown().await;
}

#[tokio::test]
async fn release_hands_over_within_a_retry_period_or_two() {
    let cluster = cluster().await;
    let shutdown = Shutdown::new();
    let a = elector(cluster.client(), "a");
    let b = elector(cluster.client(), "b");
    let leadership = a.acquire(&shutdown).await.expect("a leads");
    let standby = tokio::spawn({
        let (b, shutdown) = (b.clone(), shutdown.clone());
        async move {
            let l = b.acquire(&shutdown).await;
            (l, Instant::now())
        }
    });
    // Long enough for B to have seen the lease held, short of the lease duration.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!standby.is_finished(), "b waits while a renews");
    let released = Instant::now();
    leadership.release().await.expect("release");
    assert!(!a.is_leader());
    let (b_leads, at) = tokio::time::timeout(Duration::from_secs(5), standby)
        .await
        .expect("b takes over")
        .expect("join");
    let handover = at - released;
    assert!(
        // Two jittered retry periods (up to 1.2 each) and time for the requests.
        handover <= params().retry_period.mul_f64(2.4) + Duration::from_millis(300),
        "took {handover:?}, not a retry period or two"
    );
    assert_eq!(holder(&cluster.client()).await.as_deref(), Some("b"));
    let transitions = Api::<Lease>::namespaced(cluster.client(), NS)
        .get(LEASE)
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.lease_transitions);
    assert_eq!(transitions, Some(1));
    b_leads.expect("b").release().await.expect("release");
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_leader_that_cannot_renew_gives_up_before_the_lease_can_be_taken() {
    let cluster = cluster().await;
    let shutdown = Shutdown::new();
    let (cut_client, cut) = cuttable_client(&cluster);
    let a = elector(cut_client, "a");
    let b = elector(cluster.client(), "b");
    let leadership = a.acquire(&shutdown).await.expect("a leads");
    let standby = tokio::spawn({
        let (b, shutdown) = (b.clone(), shutdown.clone());
        async move {
            let l = b.acquire(&shutdown).await;
            (l, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    cut.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), leadership.lost())
        .await
        .expect("a notices within its renew deadline");
    let lost_at = Instant::now();
    assert!(!a.is_leader());
    assert!(
        leadership
            .lost_reason()
            .is_some_and(|r| r.contains("renew deadline")),
        "{:?}",
        leadership.lost_reason()
    );
    assert!(
        lost_at - cut_at <= params().renew_deadline + Duration::from_millis(500),
        "lost {:?} after the cut",
        lost_at - cut_at
    );
    assert!(!standby.is_finished(), "b cannot have taken it yet");
    let (b_leads, b_at) = tokio::time::timeout(Duration::from_secs(6), standby)
        .await
        .expect("b takes over once the lease expired")
        .expect("join");
    assert!(lost_at < b_at, "a gave up before b led");
    assert!(
        b_at - lost_at
            >= params().lease_duration - params().renew_deadline - Duration::from_millis(300),
        "the margin is the lease duration minus the renew deadline: {:?}",
        b_at - lost_at
    );
    assert_eq!(holder(&cluster.client()).await.as_deref(), Some("b"));
    drop(leadership);
    b_leads.expect("b").release().await.expect("release");
    cluster.shutdown().await;
}

#[tokio::test]
async fn another_holder_ends_leadership_at_the_next_renewal() {
    let cluster = cluster().await;
    let shutdown = Shutdown::new();
    let a = elector(cluster.client(), "a");
    let leadership = a.acquire(&shutdown).await.expect("a leads");
    let api = Api::<Lease>::namespaced(cluster.client(), NS);
    let mut lease = api.get(LEASE).await.expect("lease");
    lease.spec.as_mut().expect("spec").holder_identity = Some("intruder".to_owned());
    api.replace(LEASE, &PostParams::default(), &lease)
        .await
        .expect("overwrite");
    tokio::time::timeout(params().retry_period * 3, leadership.lost())
        .await
        .expect("lost within a retry period or so");
    assert!(
        leadership
            .lost_reason()
            .is_some_and(|r| r.contains("intruder")),
        "{:?}",
        leadership.lost_reason()
    );
    assert!(!a.is_leader());
    leadership
        .release()
        .await
        .expect("release after loss is a no-op");
    assert_eq!(
        api.get(LEASE)
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity)
            .as_deref(),
        Some("intruder"),
        "a lost leader never clears someone else's lease"
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_stale_write_is_refused() {
    // The guarantee the election rests on: a replace with an old resourceVersion is a 409.
    let cluster = cluster().await;
    let shutdown = Shutdown::new();
    let a = elector(cluster.client(), "a");
    let leadership = a.acquire(&shutdown).await.expect("a leads");
    let api = Api::<Lease>::namespaced(cluster.client(), NS);
    let mut stale = api.get(LEASE).await.expect("lease");
    // Wait for a renewal to move the resourceVersion on.
    tokio::time::sleep(params().retry_period * 2).await;
    stale.spec.as_mut().expect("spec").holder_identity = Some("b".to_owned());
    let err = api
        .replace(LEASE, &PostParams::default(), &stale)
        .await
        .expect_err("stale");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_conflict()),
        "{err:?}"
    );
    assert!(!leadership.is_lost());
    leadership.release().await.expect("release");
    cluster.shutdown().await;
}
