//! kube-runtime against simkube over TCP: a reflector that converges through dropped watches,
//! 410s and server restarts (with and without state), a `Controller` whose `owns()` relation
//! reconciles on child changes, the event `Recorder`, many concurrent writers seen in order by a
//! watch, and two clusters side by side that share nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource as _, ResourceExt as _};
use serde_json::json;
use simkube::Cluster;

const DEADLINE: Duration = Duration::from_secs(20);

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "data": data.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
    .expect("configmap")
}

/// Polls `check` until it returns `Some`, failing the test after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Name → `data.v` as the reflector's store currently holds them.
fn snapshot(store: &Store<ConfigMap>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|o| {
            let v = o
                .data
                .as_ref()
                .and_then(|d| d.get("v").cloned())
                .unwrap_or_default();
            (o.name_any(), v)
        })
        .collect()
}

async fn converged(store: &Store<ConfigMap>, what: &str, want: &[(&str, &str)]) {
    let want: BTreeMap<String, String> = want
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    eventually(what, || {
        let got = snapshot(store);
        let ok = got == want;
        async move { ok.then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reflector_converges_through_dropped_watches_410s_and_restarts() {
    // No periodic bookmarks: the watcher's resume point only moves with configmap events.
    let c = Cluster::builder()
        .history(4)
        .bookmark_interval(Duration::from_secs(600))
        .start()
        .await
        .expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let (reader, writer) = reflector::store();
    // Short server-side timeouts make the watcher come back often, as a long-lived one would.
    let stream = reflector::reflector(
        writer,
        watcher::watcher(api.clone(), watcher::Config::default().timeout(2)),
    )
    .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));

    api.create(&PostParams::default(), &cm("a", &[("v", "1")]))
        .await
        .expect("a");
    api.create(&PostParams::default(), &cm("b", &[("v", "1")]))
        .await
        .expect("b");
    converged(&reader, "initial objects", &[("a", "1"), ("b", "1")]).await;

    // A dropped watch: the watcher resumes from its RV and misses nothing.
    c.break_watches();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await
    .expect("update a");
    api.delete("b", &DeleteParams::default())
        .await
        .expect("delete b");
    converged(&reader, "after a dropped watch", &[("a", "2")]).await;

    // A write elsewhere moves the global RV past the watcher's; compaction then makes its
    // resume point too old: the resumed watch gets an in-stream 410 and the watcher re-lists.
    let secrets: Api<Secret> = Api::default_namespaced(c.client());
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}})).expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    c.compact();
    c.break_watches();
    for n in ["c", "d", "e", "f", "g"] {
        api.create(&PostParams::default(), &cm(n, &[("v", "1")]))
            .await
            .expect("create");
    }
    api.delete("c", &DeleteParams::default())
        .await
        .expect("delete c");
    converged(
        &reader,
        "after a 410",
        &[("a", "2"), ("d", "1"), ("e", "1"), ("f", "1"), ("g", "1")],
    )
    .await;

    // A restart that keeps state: clients reconnect to the same port. A request racing the
    // close of a pooled connection may fail once, as against a restarting kube-apiserver.
    c.restart(true).await;
    eventually("a write after the restart", || async {
        let patch = Patch::Merge(json!({"data": {"v": "3"}}));
        match api.patch("d", &PatchParams::default(), &patch).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(s)) => panic!("the server refused the write: {s:?}"),
            Err(_) => None,
        }
    })
    .await;
    converged(
        &reader,
        "after a restart keeping state",
        &[("a", "2"), ("d", "3"), ("e", "1"), ("f", "1"), ("g", "1")],
    )
    .await;

    // A restart that loses state: the watcher's RV is unknown to the new history, it re-lists
    // and the store empties.
    c.restart(false).await;
    converged(&reader, "after a restart losing state", &[]).await;
    eventually("a write after the wipe", || async {
        match api
            .create(&PostParams::default(), &cm("fresh", &[("v", "9")]))
            .await
        {
            Ok(_) => Some(()),
            Err(kube::Error::Api(s)) => panic!("the server refused the write: {s:?}"),
            Err(_) => None,
        }
    })
    .await;
    converged(&reader, "a write after the wipe", &[("fresh", "9")]).await;

    let lists = c
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.path.ends_with("/configmaps"))
        .count();
    assert!(
        lists >= 3,
        "initial list, after the 410, after the wipe: {lists}"
    );
    task.abort();
    c.shutdown().await;
}

struct Ctx {
    secrets: Api<Secret>,
    reconciles: AtomicUsize,
}

/// Keeps one Secret per ConfigMap, owned by it, holding the ConfigMap's `data.v`.
async fn reconcile(parent: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    ctx.reconciles.fetch_add(1, Ordering::SeqCst);
    let owner = parent.controller_owner_ref(&()).expect("parent has a uid");
    let want = parent
        .data
        .as_ref()
        .and_then(|d| d.get("v").cloned())
        .unwrap_or_default();
    let child: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{}-child", parent.name_any()), "ownerReferences": [owner]},
        "stringData": {"v": want},
    }))
    .expect("secret");
    ctx.secrets
        .patch(
            &child.name_any(),
            &PatchParams::apply("contract-test").force(),
            &Patch::Apply(&child),
        )
        .await?;
    Ok(Action::await_change())
}

fn secret_value(s: &Secret) -> Option<String> {
    let data = s.data.as_ref()?;
    Some(String::from_utf8_lossy(&data.get("v")?.0).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_owns_reconciles_when_a_child_changes() {
    let c = Cluster::builder().start().await.expect("start");
    let client = c.client();
    let parents: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    parents
        .create(&PostParams::default(), &cm("parent", &[("v", "one")]))
        .await
        .expect("parent");
    let ctx = Arc::new(Ctx {
        secrets: secrets.clone(),
        reconciles: AtomicUsize::new(0),
    });
    let controller = Controller::new(parents.clone(), watcher::Config::default())
        .owns(secrets.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _: &kube::Error, _| Action::requeue(Duration::from_millis(200)),
            ctx.clone(),
        )
        .for_each(|_| async {});
    let task = tokio::spawn(controller);

    let child = eventually("the child is created", || async {
        secrets.get_opt("parent-child").await.expect("get")
    })
    .await;
    assert_eq!(secret_value(&child).as_deref(), Some("one"));
    let owner = &child.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("ConfigMap", "parent", Some(true))
    );

    // Someone else edits the child: the owns() watch maps it to the parent, which is reconciled
    // and puts the value back.
    let before = ctx.reconciles.load(Ordering::SeqCst);
    secrets
        .patch(
            "parent-child",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"v": "tampered"}})),
        )
        .await
        .expect("tamper");
    eventually("the child is repaired", || async {
        let s = secrets.get("parent-child").await.expect("get");
        (secret_value(&s).as_deref() == Some("one")).then_some(())
    })
    .await;
    assert!(
        ctx.reconciles.load(Ordering::SeqCst) > before,
        "a child change triggered a reconcile"
    );

    // Deleting the child brings it back.
    secrets
        .delete("parent-child", &DeleteParams::default())
        .await
        .expect("delete child");
    eventually("the child is recreated", || async {
        secrets.get_opt("parent-child").await.expect("get")
    })
    .await;

    // A parent change flows to the child as well.
    parents
        .patch(
            "parent",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "two"}})),
        )
        .await
        .expect("update parent");
    eventually("the child follows the parent", || async {
        let s = secrets.get("parent-child").await.expect("get");
        (secret_value(&s).as_deref() == Some("two")).then_some(())
    })
    .await;
    task.abort();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn recorder_publishes_events_and_counts_repeats() {
    let c = Cluster::builder().start().await.expect("start");
    let client = c.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let target = cms
        .create(&PostParams::default(), &cm("observed", &[]))
        .await
        .expect("create");
    let reference = target.object_ref(&());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "contract-controller".into(),
            instance: Some("replica-1".into()),
        },
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: "Drifted".into(),
        note: Some("the value moved".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.expect("publish");
    let events: Api<K8sEvent> = Api::default_namespaced(client.clone());
    let list = events.list(&ListParams::default()).await.expect("list");
    assert_eq!(list.items.len(), 1);
    let got = &list.items[0];
    assert_eq!(got.reason.as_deref(), Some("Drifted"));
    assert_eq!(got.note.as_deref(), Some("the value moved"));
    assert_eq!(got.type_.as_deref(), Some("Warning"));
    assert_eq!(
        got.reporting_controller.as_deref(),
        Some("contract-controller")
    );
    assert_eq!(got.reporting_instance.as_deref(), Some("replica-1"));
    let regarding = got.regarding.as_ref().expect("regarding");
    assert_eq!(regarding.uid, target.metadata.uid);
    assert!(got.event_time.is_some());

    // The same event again becomes a series on the same object (a merge patch).
    recorder
        .publish(&ev, &reference)
        .await
        .expect("publish again");
    let list = events.list(&ListParams::default()).await.expect("list");
    assert_eq!(list.items.len(), 1, "a repeat is not a new event");
    assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));

    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_concurrent_writers_lose_no_update_and_a_watch_sees_each_in_order() {
    const WRITERS: usize = 16;
    const EACH: usize = 50;
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let created = api
        .create(&PostParams::default(), &cm("counter", &[("n", "0")]))
        .await
        .expect("create");
    let start_rv = created.resource_version().expect("rv");
    let mut watch = api
        .watch(
            &WatchParams::default().fields("metadata.name=counter"),
            &start_rv,
        )
        .await
        .expect("watch")
        .boxed();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        // Each writer has its own client, so its own connections.
        let api: Api<ConfigMap> = Api::default_namespaced(c.client());
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0usize;
            for _ in 0..EACH {
                loop {
                    let mut cur = api.get("counter").await.expect("get");
                    let data = cur.data.get_or_insert_with(Default::default);
                    let n: usize = data["n"].parse().expect("n");
                    data.insert("n".into(), (n + 1).to_string());
                    match api.replace("counter", &PostParams::default(), &cur).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "Conflict" => {
                            conflicts += 1;
                        }
                        Err(e) => panic!("unexpected error: {e:?}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.expect("writer");
    }
    let total = WRITERS * EACH;
    let fin = api.get("counter").await.expect("get");
    assert_eq!(
        fin.data.expect("data")["n"],
        total.to_string(),
        "{conflicts} conflicts retried"
    );

    // The watch delivers every one of the writes, each value once, in RV order.
    let mut values = Vec::new();
    let mut last_rv = 0u64;
    while values.len() < total {
        let ev = tokio::time::timeout(DEADLINE, watch.next())
            .await
            .expect("watch keeps up")
            .expect("stream open")
            .expect("event");
        match ev {
            WatchEvent::Modified(o) => {
                let rv: u64 = o
                    .resource_version()
                    .expect("rv")
                    .parse()
                    .expect("numeric rv");
                assert!(rv > last_rv, "RVs increase: {rv} after {last_rv}");
                last_rv = rv;
                values.push(o.data.expect("data")["n"].parse::<usize>().expect("n"));
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(values, (1..=total).collect::<Vec<_>>());
    c.shutdown().await;
}

/// A kube-rs client built only from a kubeconfig file, as a user's tool would.
async fn client_from_kubeconfig(path: &std::path::Path) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread")]
async fn two_clusters_side_by_side_share_nothing() {
    let a = Cluster::builder()
        .name("east")
        .tls(true)
        .start()
        .await
        .expect("east");
    let b = Cluster::builder()
        .name("west")
        .tls(true)
        .start()
        .await
        .expect("west");
    let dir = tempfile::tempdir().expect("tempdir");
    let (path_a, path_b) = (dir.path().join("east"), dir.path().join("west"));
    a.write_kubeconfig(&path_a).expect("east kubeconfig");
    b.write_kubeconfig(&path_b).expect("west kubeconfig");
    let (ca, cb) = (
        client_from_kubeconfig(&path_a).await,
        client_from_kubeconfig(&path_b).await,
    );
    let (api_a, api_b): (Api<ConfigMap>, Api<ConfigMap>) = (
        Api::default_namespaced(ca.clone()),
        Api::default_namespaced(cb.clone()),
    );

    let mut rvs = (BTreeSet::new(), BTreeSet::new());
    let mut uids = (BTreeSet::new(), BTreeSet::new());
    for i in 0..20 {
        let x = api_a
            .create(&PostParams::default(), &cm(&format!("east-{i}"), &[]))
            .await
            .expect("east");
        let y = api_b
            .create(&PostParams::default(), &cm(&format!("west-{i}"), &[]))
            .await
            .expect("west");
        rvs.0.insert(x.resource_version().expect("rv"));
        rvs.1.insert(y.resource_version().expect("rv"));
        uids.0.insert(x.uid().expect("uid"));
        uids.1.insert(y.uid().expect("uid"));
    }
    assert!(rvs.0.is_disjoint(&rvs.1), "RV spaces overlap: {rvs:?}");
    assert!(uids.0.is_disjoint(&uids.1));
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.items
            .into_iter()
            .map(|o| o.name_any())
            .filter(|n| n != "kube-root-ca.crt")
            .collect::<Vec<_>>()
    };
    let in_a = names(api_a.list(&ListParams::default()).await.expect("list east"));
    let in_b = names(api_b.list(&ListParams::default()).await.expect("list west"));
    assert!(
        in_a.iter().all(|n| n.starts_with("east-")) && in_a.len() == 20,
        "{in_a:?}"
    );
    assert!(
        in_b.iter().all(|n| n.starts_with("west-")) && in_b.len() == 20,
        "{in_b:?}"
    );

    // Each kubeconfig's CA and token fit only its own cluster.
    let mut crossed = kube::config::Kubeconfig::read_from(&path_a).expect("read");
    crossed.clusters[0]
        .cluster
        .as_mut()
        .expect("cluster")
        .server = Some(b.url());
    let config = kube::Config::from_custom_kubeconfig(crossed, &Default::default())
        .await
        .expect("config");
    let crossed: Api<ConfigMap> =
        Api::default_namespaced(Client::try_from(config).expect("client"));
    let err = crossed
        .list(&ListParams::default())
        .await
        .expect_err("foreign CA");
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "the TLS handshake fails first: {err:?}"
    );
    let token_only = b.client_with_token(a.admin_token()).expect("client");
    let err = Api::<ConfigMap>::default_namespaced(token_only)
        .list(&ListParams::default())
        .await
        .expect_err("foreign token");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 401),
        "{err:?}"
    );

    // Stopping one leaves the other serving; clients of the stopped one get connection errors.
    a.shutdown().await;
    let err = api_a
        .list(&ListParams::default())
        .await
        .expect_err("east is gone");
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "a connection error: {err:?}"
    );
    assert_eq!(
        names(
            api_b
                .list(&ListParams::default())
                .await
                .expect("west still serves")
        )
        .len(),
        20
    );
    b.shutdown().await;
}
