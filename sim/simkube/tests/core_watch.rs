//! Contract tests for list and watch through the real kube-rs client and runtime: pagination
//! with a consistent snapshot, expired continue tokens, selectors, watch replay order,
//! bookmarks, 410 recovery, streaming lists, selector transitions, and concurrent writers.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use simkube::Cluster;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"n": "0"}}),
    )
    .expect("cm")
}

async fn create(api: &Api<ConfigMap>, name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    api.create(&PostParams::default(), &cm(name, labels))
        .await
        .expect("create")
}

fn names(list: &[ConfigMap]) -> Vec<String> {
    list.iter()
        .map(|c| c.metadata.name.clone().expect("name"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn pagination_is_a_consistent_snapshot_even_with_writes_between_pages() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    for n in ["a", "b", "c"] {
        create(&api, n, &[]).await;
    }
    let p1 = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("page 1");
    assert_eq!(names(&p1.items), ["a"]);
    assert_eq!(p1.metadata.remaining_item_count, Some(2));
    let token = p1.metadata.continue_.clone().expect("continue");
    // Writes between pages must not show up in later pages.
    api.delete("b", &Default::default())
        .await
        .expect("delete b");
    create(&api, "bb", &[]).await;
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"n": "9"}})),
    )
    .await
    .expect("patch");
    let p2 = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(names(&p2.items), ["b"], "b as of the first page");
    assert_eq!(p2.metadata.resource_version, p1.metadata.resource_version);
    let token = p2.metadata.continue_.clone().expect("continue");
    let p3 = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect("page 3");
    assert_eq!(names(&p3.items), ["c"]);
    assert_eq!(
        p3.items[0].data.as_ref().expect("data")["n"],
        "0",
        "c as of the first page"
    );
    assert!(p3.metadata.continue_.as_deref().is_none_or(str::is_empty));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_continue_token_is_410() {
    let c = Cluster::builder().history(2).start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    for n in ["a", "b", "c"] {
        create(&api, n, &[]).await;
    }
    let p1 = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("page 1");
    for n in ["d", "e", "f"] {
        create(&api, n, &[]).await;
    }
    let token = p1.metadata.continue_.expect("continue");
    let err = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect_err("expired");
    let kube::Error::Api(status) = err else {
        panic!("api error expected: {err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    assert!(
        status
            .message
            .starts_with("The provided continue parameter is too old"),
        "{}",
        status.message
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn label_and_field_selectors() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "web", &[("app", "web"), ("tier", "front")]).await;
    create(&api, "db", &[("app", "db")]).await;
    create(&api, "none", &[]).await;
    let l = |s: &str| ListParams::default().labels(s);
    let got = api.list(&l("app=web")).await.expect("eq");
    assert_eq!(names(&got.items), ["web"]);
    let got = api.list(&l("app in (web,db),!tier")).await.expect("set");
    assert_eq!(names(&got.items), ["db"]);
    let got = api.list(&l("app!=web")).await.expect("neq");
    assert_eq!(names(&got.items), ["db", "none"]);
    let got = api
        .list(&ListParams::default().fields("metadata.name=db"))
        .await
        .expect("field");
    assert_eq!(names(&got.items), ["db"]);
    let err = api
        .list(&ListParams::default().fields("spec.foo=x"))
        .await
        .expect_err("unsupported");
    let kube::Error::Api(status) = err else {
        panic!("api error")
    };
    assert_eq!(status.code, 400);
    assert_eq!(status.message, "field label not supported: spec.foo");

    let pods: Api<Pod> = Api::default_namespaced(c.client());
    for (name, node) in [("p1", "n1"), ("p2", "n2")] {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i:1"}]}}))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod");
    }
    let on_n2 = pods
        .list(&ListParams::default().fields("spec.nodeName=n2"))
        .await
        .expect("pods");
    assert_eq!(on_n2.items.len(), 1);
    assert_eq!(on_n2.items[0].metadata.name.as_deref(), Some("p2"));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_from_rv_sees_exactly_the_later_writes_in_order() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "before", &[]).await;
    let list = api.list(&ListParams::default()).await.expect("list");
    let rv = list.metadata.resource_version.expect("rv");
    create(&api, "x", &[]).await;
    api.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"n": "1"}})),
    )
    .await
    .expect("patch");
    api.delete("x", &Default::default()).await.expect("delete");
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("in time")
            .expect("ok");
        match ev.expect("event") {
            WatchEvent::Added(o) => seen.push((
                "ADDED",
                o.metadata.name.expect("n"),
                o.metadata.resource_version,
            )),
            WatchEvent::Modified(o) => seen.push((
                "MODIFIED",
                o.metadata.name.expect("n"),
                o.metadata.resource_version,
            )),
            WatchEvent::Deleted(o) => seen.push((
                "DELETED",
                o.metadata.name.expect("n"),
                o.metadata.resource_version,
            )),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("error event {e:?}"),
        }
    }
    let kinds: Vec<_> = seen.iter().map(|(k, n, _)| (*k, n.as_str())).collect();
    assert_eq!(kinds, [("ADDED", "x"), ("MODIFIED", "x"), ("DELETED", "x")]);
    let rvs: Vec<u64> = seen
        .iter()
        .map(|(_, _, rv)| rv.as_deref().expect("rv").parse().expect("n"))
        .collect();
    assert!(
        rvs.windows(2).all(|w| w[0] < w[1]),
        "increasing RVs {rvs:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bookmarks_carry_kind_and_api_version() {
    let c = Cluster::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(3), stream.try_next())
        .await
        .expect("in time")
        .expect("ok");
    match ev.expect("event") {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.types.kind, "ConfigMap");
            assert_eq!(b.types.api_version, "v1");
            let brv: u64 = b.metadata.resource_version.parse().expect("n");
            assert!(brv >= rv.parse::<u64>().expect("n"));
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn too_old_rv_is_an_in_stream_410_error_event() {
    let c = Cluster::builder().history(2).start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let old = create(&api, "a", &[])
        .await
        .metadata
        .resource_version
        .expect("rv");
    for n in ["b", "c", "d"] {
        create(&api, n, &[]).await;
    }
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &old)
        .await
        .expect("HTTP 200")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(3), stream.try_next())
        .await
        .expect("in time")
        .expect("ok");
    match ev.expect("event") {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message
                    .starts_with(&format!("too old resource version: {old} (")),
                "{}",
                e.message
            );
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
    c.shutdown().await;
}

/// Runs a default watcher, collecting the names it currently knows, until `want` holds.
async fn watcher_until(
    stream: &mut (impl futures::Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin),
    known: &mut std::collections::BTreeSet<String>,
    relists: &mut usize,
    want: impl Fn(&std::collections::BTreeSet<String>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut init = std::collections::BTreeSet::new();
    while !want(known) {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("watcher converges in time");
        match next.expect("stream continues") {
            Ok(Event::Init) => {
                *relists += 1;
                init.clear();
            }
            Ok(Event::InitApply(o)) => {
                init.insert(o.metadata.name.expect("n"));
            }
            Ok(Event::InitDone) => *known = std::mem::take(&mut init),
            Ok(Event::Apply(o)) => {
                known.insert(o.metadata.name.expect("n"));
            }
            Ok(Event::Delete(o)) => {
                known.remove(&o.metadata.name.expect("n"));
            }
            Err(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_runtime_watcher_recovers_from_broken_watches_and_410() {
    let c = Cluster::builder().history(3).start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "a", &[]).await;
    let cfg = watcher::Config::default().timeout(2);
    let mut stream = watcher::watcher(api.clone(), cfg).boxed();
    let mut known = Default::default();
    let mut relists = 0;
    watcher_until(&mut stream, &mut known, &mut relists, |k| k.contains("a")).await;
    assert_eq!(relists, 1);

    c.break_watches();
    create(&api, "b", &[]).await;
    watcher_until(&mut stream, &mut known, &mut relists, |k| k.contains("b")).await;

    // Compact while the watcher is between watches: its resume RV is gone, it must re-list.
    c.compact();
    c.break_watches();
    api.delete("a", &Default::default()).await.expect("delete");
    for n in ["c", "d", "e", "f"] {
        create(&api, n, &[]).await;
    }
    watcher_until(&mut stream, &mut known, &mut relists, |k| {
        !k.contains("a") && k.contains("f")
    })
    .await;
    assert_eq!(
        known.iter().map(String::as_str).collect::<Vec<_>>(),
        ["b", "c", "d", "e", "f"]
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_runtime_watcher_relists_after_a_410_error_event() {
    // No periodic bookmarks: the watcher's resume point stays at its list RV.
    let c = Cluster::builder()
        .bookmark_interval(Duration::from_secs(600))
        .start()
        .await
        .expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "a", &[]).await;
    let mut stream = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let mut known = Default::default();
    let mut relists = 0;
    watcher_until(&mut stream, &mut known, &mut relists, |k| k.contains("a")).await;
    // A write of another type moves the global RV past the watcher's; compaction then makes
    // its resume point too old, so the resumed watch gets an in-stream 410.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::default_namespaced(c.client());
    let secret = serde_json::from_value(json!({"metadata": {"name": "s"}})).expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    c.compact();
    c.break_watches();
    create(&api, "z", &[]).await;
    watcher_until(&mut stream, &mut known, &mut relists, |k| k.contains("z")).await;
    assert_eq!(relists, 2, "the 410 made the watcher re-list once");
    let watches: Vec<_> = c
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("configmaps"))
        .collect();
    let lists = watches.iter().filter(|r| r.verb == "list").count();
    assert_eq!(
        lists, 2,
        "listed, got the 410 on the resumed watch, re-listed: {watches:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_list_watcher_reaches_init_done() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "a", &[]).await;
    create(&api, "b", &[]).await;
    let mut stream =
        watcher::watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("in time")
            .expect("more");
        match ev.expect("ok") {
            Event::Init => {}
            Event::InitApply(o) => initial.push(o.metadata.name.expect("n")),
            Event::InitDone => break,
            other => panic!("unexpected before InitDone: {other:?}"),
        }
    }
    assert_eq!(initial, ["a", "b"]);
    create(&api, "c", &[]).await;
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("in time")
        .expect("more");
    match ev.expect("ok") {
        Event::Apply(o) => assert_eq!(o.metadata.name.as_deref(), Some("c")),
        other => panic!("expected Apply, got {other:?}"),
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn selector_transitions_become_added_and_deleted() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "m", &[("pick", "no")]).await;
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let wp = WatchParams::default().labels("pick=yes").timeout(5);
    let mut stream = api.watch(&wp, &rv).await.expect("watch").boxed();
    let set = |v: &str| json!({"metadata": {"labels": {"pick": v}}});
    api.patch("m", &PatchParams::default(), &Patch::Merge(&set("yes")))
        .await
        .expect("enter");
    api.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"n": "1"}})),
    )
    .await
    .expect("stay");
    api.patch("m", &PatchParams::default(), &Patch::Merge(&set("no")))
        .await
        .expect("leave");
    let mut kinds = Vec::new();
    while kinds.len() < 3 {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("in time")
            .expect("ok");
        kinds.push(match ev.expect("event") {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(o) => {
                assert_eq!(
                    o.metadata.labels.expect("labels")["pick"],
                    "no",
                    "DELETED carries the new state"
                );
                "DELETED"
            }
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"]);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_without_rv_replays_current_state_as_added() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "a", &[]).await;
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), "0")
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(3), stream.try_next())
        .await
        .expect("in time")
        .expect("ok");
    assert!(matches!(ev, Some(WatchEvent::Added(o)) if o.metadata.name.as_deref() == Some("a")));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_read_modify_write_loses_no_update() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "counter", &[]).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..50 {
                loop {
                    let mut cur = api.get("counter").await.expect("get");
                    let data = cur.data.get_or_insert_with(Default::default);
                    let n: u64 = data["n"].parse().expect("n");
                    data.insert("n".into(), (n + 1).to_string());
                    match api.replace("counter", &PostParams::default(), &cur).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.expect("task");
    }
    let fin = api.get("counter").await.expect("get");
    assert_eq!(
        fin.data.expect("data")["n"],
        "400",
        "no lost update ({conflicts} conflicts retried)"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_clusters_keep_separate_state() {
    let a = Cluster::builder().name("a").start().await.expect("a");
    let b = Cluster::builder().name("b").start().await.expect("b");
    let api_a: Api<ConfigMap> = Api::default_namespaced(a.client());
    let api_b: Api<ConfigMap> = Api::default_namespaced(b.client());
    create(&api_a, "only-a", &[]).await;
    assert!(api_b.get_opt("only-a").await.expect("get").is_none());
    assert_ne!(a.url(), b.url());
    // A token of one cluster is worthless in the other.
    let cross = b.client_with_token(a.admin_token()).expect("client");
    let err = Api::<ConfigMap>::default_namespaced(cross)
        .list(&ListParams::default())
        .await
        .expect_err("401");
    assert!(matches!(err, kube::Error::Api(s) if s.code == 401));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metadata_watcher_gets_partial_object_metadata() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create(&api, "a", &[("k", "v")]).await;
    let meta: Api<kube::core::PartialObjectMeta<ConfigMap>> = Api::default_namespaced(c.client());
    let mut stream = watcher::watcher(meta, watcher::Config::default()).boxed();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("in time")
            .expect("more");
        if let Event::InitApply(o) = ev.expect("ok") {
            assert_eq!(o.metadata.name.as_deref(), Some("a"));
            assert_eq!(o.metadata.labels.expect("labels")["k"], "v");
            break;
        }
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exact_list_at_a_compacted_rv_is_410_and_at_a_kept_rv_is_the_old_state() {
    let c = Cluster::builder().start().await.expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let first = create(&api, "a", &[])
        .await
        .metadata
        .resource_version
        .expect("rv");
    create(&api, "b", &[]).await;
    let exact = ListParams::default()
        .at(&first)
        .matching(kube::api::VersionMatch::Exact);
    let old = api.list(&exact).await.expect("exact list in history");
    assert_eq!(names(&old.items), ["a"]);
    assert_eq!(
        old.metadata.resource_version.as_deref(),
        Some(first.as_str())
    );
    c.compact();
    let err = api.list(&exact).await.expect_err("compacted");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{err:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_seconds_ends_the_stream_after_a_final_bookmark() {
    let c = Cluster::builder()
        .bookmark_interval(Duration::from_secs(600))
        .start()
        .await
        .expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let started = std::time::Instant::now();
    let stream = api
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .expect("watch");
    let events: Vec<_> =
        tokio::time::timeout(Duration::from_secs(5), stream.try_collect::<Vec<_>>())
            .await
            .expect("the stream ends by itself")
            .expect("clean end");
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(
        matches!(events.last(), Some(WatchEvent::Bookmark(_))),
        "{events:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_that_does_not_read_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = Cluster::builder()
        .watch_buffer(16)
        .start()
        .await
        .expect("start");
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut tcp = tokio::net::TcpStream::connect(c.addr())
        .await
        .expect("connect");
    let req = format!(
        "GET /api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        c.admin_token()
    );
    tcp.write_all(req.as_bytes()).await.expect("write");
    // Far more than socket buffers hold, while the watcher reads nothing.
    let big = "x".repeat(200 * 1024);
    for i in 0..100 {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("big-{i}")}, "data": {"k": big}}),
        )
        .expect("cm");
        api.create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut out))
        .await
        .expect("the server ended the stream instead of waiting for the timeout")
        .expect("read");
    let events = out
        .windows(14)
        .filter(|w| w == b"\"type\":\"ADDED\"")
        .count();
    assert!(events > 0 && events < 100, "cut off after {events} events");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn events_v1_watch_selects_by_type() {
    use k8s_openapi::api::events::v1::Event;
    let c = Cluster::builder().start().await.expect("start");
    let events: Api<Event> = Api::default_namespaced(c.client());
    let event = |name: &str, type_: &str| -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "eventTime": "2026-11-28T10:00:00.000000Z",
            "reportingController": "kubelet",
            "reportingInstance": "node-1",
            "action": "Start",
            "reason": if type_ == "Warning" { "BackOff" } else { "Started" },
            "type": type_,
            "regarding": {"kind": "Pod", "name": "web-0", "namespace": "default"},
        }))
        .expect("event")
    };
    let mut watch = events
        .watch(&WatchParams::default().fields("type=Warning"), "0")
        .await
        .expect("watch")
        .boxed();
    for (name, type_) in [("started", "Normal"), ("backoff", "Warning")] {
        events
            .create(&PostParams::default(), &event(name, type_))
            .await
            .expect("create");
    }
    // The Normal Event came first: the first event the watch sends is the Warning.
    let first = tokio::time::timeout(Duration::from_secs(5), watch.try_next())
        .await
        .expect("a watch event in time")
        .expect("watch stream")
        .expect("not ended");
    match first {
        WatchEvent::Added(e) => {
            assert_eq!(e.metadata.name.as_deref(), Some("backoff"));
        }
        other => panic!("expected the Warning ADDED, got {other:?}"),
    }
    let listed = events
        .list(&ListParams::default().fields("type!=Warning"))
        .await
        .expect("list");
    let names: Vec<_> = listed
        .iter()
        .filter_map(|e| e.metadata.name.clone())
        .collect();
    assert_eq!(names, ["started"]);
    c.shutdown().await;
}
