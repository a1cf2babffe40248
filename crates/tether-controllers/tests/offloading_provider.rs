//! The provider's side of offloading, in process: a simkube API server with RBAC, a controller
//! replica, a Tenant with a granted ResourceSlice, and what a consumer writes here (a
//! NamespaceOffloading request, ShadowPods). Covers the twin namespace and its binding, a
//! taken name, admission within the grant, the Pod and its status, drift repair, what the
//! consumer's identity may do in its twin, and the twin's removal with the request.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, Namespace, Node, NodeCondition, NodeStatus, Pod, PodCondition, PodSpec, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use prometheus_client::registry::Registry;
use simkube::Cluster;
use simkube::controllers::Controllers;
use tether_api::ClusterId;
use tether_api::authentication::{ResourceSlice, ResourceSliceSpec, Tenant, TenantSpec};
use tether_api::conditions as cond;
use tether_api::names::{self, labels, objects};
use tether_api::offloading::{
    NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec, ShadowPod,
    ShadowPodSpec,
};
use tether_controllers::metrics::Metrics;
use tether_controllers::run::{self, Replica};
use tether_testkit::assert_eventually_async;
use tokio_util::sync::CancellationToken;

const NS: &str = "tether-system";
const PROVIDER: &str = "prov";
const CONSUMER: &str = "c1";

struct Provider {
    cluster: Cluster,
    _replica: Arc<Replica>,
    stop: CancellationToken,
}

impl Provider {
    /// A provider with consumer `c1` as its tenant, granted cpu 2 and memory 2Gi.
    async fn start() -> Provider {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info,kube=warn,simkube=warn".into()),
            )
            .try_init();
        // No scheduler and no node agent: Pods stay unbound, and the test writes their status.
        let cluster = Cluster::builder()
            .name(PROVIDER)
            .tls(true)
            .rbac(true)
            .controllers(Controllers {
                namespace: true,
                garbage_collector: true,
                service_accounts: true,
                ..Controllers::none()
            })
            .start()
            .await
            .expect("simkube starts");
        let client = cluster.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in tether_api::crds::all() {
            let name = crd.metadata.name.clone().expect("name");
            crds.create(&PostParams::default(), &crd)
                .await
                .expect("crd");
            tokio::time::timeout(
                Duration::from_secs(10),
                await_condition(crds.clone(), &name, conditions::is_crd_established()),
            )
            .await
            .expect("established in time")
            .expect("watch");
        }
        create(&Api::all(client.clone()), &namespace(NS, BTreeMap::new())).await;
        // `tether install` creates the roles the controller binds.
        for (name, rules) in [
            (objects::TENANT_ROLE, tether_api::rbac::tenant_rules()),
            (
                objects::TENANT_OFFLOADED_ROLE,
                tether_api::rbac::tenant_offloaded_rules(),
            ),
        ] {
            let role = ClusterRole {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                rules: Some(rules),
                ..Default::default()
            };
            create(&Api::all(client.clone()), &role).await;
        }
        let node = Node {
            metadata: ObjectMeta {
                name: Some("node-1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let nodes: Api<Node> = Api::all(client.clone());
        let mut node = nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
        node.status = Some(NodeStatus {
            allocatable: Some(quantities(&[
                ("cpu", "4"),
                ("memory", "8Gi"),
                ("pods", "110"),
            ])),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        nodes
            .replace_status("node-1", &PostParams::default(), &node)
            .await
            .expect("node status");

        let settings = support::settings(NS, cluster.url());
        let stop = CancellationToken::new();
        let (replica, _tasks) = run::start(
            client.clone(),
            ClusterId::new(PROVIDER).expect("id"),
            settings,
            "127.0.0.1:0".parse().expect("addr"),
            Metrics::register(&mut Registry::default()),
            stop.clone(),
        )
        .await
        .expect("controller starts");
        let replica = Arc::new(replica);
        {
            let leader = replica.clone();
            let token = stop.clone();
            tokio::spawn(async move { leader.lead(token).await });
        }

        // What authentication leaves behind: the Tenant (its reconciler makes the tenant
        // namespace), then the consumer's request for resources.
        let tenant = Tenant {
            metadata: ObjectMeta {
                name: Some(CONSUMER.into()),
                ..Default::default()
            },
            spec: TenantSpec {
                cluster_id: CONSUMER.into(),
                public_key: format!("{}=", "A".repeat(43)),
                tenant_condition: Default::default(),
            },
            status: None,
        };
        create(&Api::all(client.clone()), &tenant).await;
        let tenant_ns = tenant_ns();
        assert_eventually_async!(
            Api::<Namespace>::all(client.clone())
                .get_opt(&tenant_ns)
                .await
                .expect("get")
                .is_some(),
            Duration::from_secs(10),
            "waiting"
        );
        let slice = ResourceSlice {
            metadata: ObjectMeta {
                name: Some(PROVIDER.into()),
                namespace: Some(tenant_ns.clone()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                consumer_cluster_id: CONSUMER.into(),
                provider_cluster_id: PROVIDER.into(),
                class: "default".into(),
                resources: quantities(&[("cpu", "2"), ("memory", "2Gi")]),
            },
            status: None,
        };
        create(&Api::namespaced(client.clone(), &tenant_ns), &slice).await;
        let slices: Api<ResourceSlice> = Api::namespaced(client.clone(), &tenant_ns);
        assert_eventually_async!(
            slices
                .get(PROVIDER)
                .await
                .ok()
                .and_then(|s| s.status)
                .is_some_and(|s| cond::is_true(&s.conditions, cond::types::RESOURCES)),
            Duration::from_secs(10),
            "waiting"
        );
        Provider {
            cluster,
            _replica: replica,
            stop,
        }
    }

    fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    /// A client acting as the consumer's identity (its certificate's username).
    async fn as_consumer(&self) -> kube::Client {
        let kubeconfig =
            kube::config::Kubeconfig::from_yaml(&self.cluster.kubeconfig()).expect("kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        config.auth_info.impersonate = Some(names::consumer_username(
            &ClusterId::new(CONSUMER).expect("id"),
        ));
        kube::Client::try_from(config).expect("client")
    }

    /// The request for a twin of the consumer's namespace `origin`, as the consumer writes it.
    async fn request(&self, origin: &str, strategy: NamespaceMappingStrategy) {
        let req = NamespaceOffloading {
            metadata: ObjectMeta {
                name: Some(origin.into()),
                namespace: Some(tenant_ns()),
                labels: Some(BTreeMap::from([(
                    labels::ORIGIN_NAMESPACE.into(),
                    origin.into(),
                )])),
                ..Default::default()
            },
            spec: NamespaceOffloadingSpec {
                pod_offloading_strategy: Default::default(),
                namespace_mapping_strategy: strategy,
                remote_namespace_name: None,
                cluster_selector: BTreeMap::new(),
            },
            status: None,
        };
        create(
            &Api::namespaced(self.as_consumer().await, &tenant_ns()),
            &req,
        )
        .await;
    }

    /// Waits until the request `origin` reports `phase`; returns it.
    async fn wait_request(&self, origin: &str, phase: &str) -> NamespaceOffloading {
        let api: Api<NamespaceOffloading> = Api::namespaced(self.client(), &tenant_ns());
        let mut last = None;
        for _ in 0..100 {
            last = api.get_opt(origin).await.expect("get");
            if last
                .as_ref()
                .and_then(|r| r.status.as_ref())
                .and_then(|s| s.offloading_phase.as_deref())
                == Some(phase)
            {
                return last.expect("present");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("request {origin} never reached {phase}: {last:#?}");
    }

    async fn shadow_pod(&self, ns: &str, name: &str, cpu: Option<&str>) {
        let sp = ShadowPod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(BTreeMap::from([("app".into(), name.into())])),
                ..Default::default()
            },
            spec: ShadowPodSpec {
                consumer_cluster_id: CONSUMER.into(),
                pod: pod_spec(cpu),
            },
            status: None,
        };
        create(&Api::namespaced(self.as_consumer().await, ns), &sp).await;
    }

    /// Waits until Pod `ns/name` exists; returns it.
    async fn wait_pod(&self, ns: &str, name: &str) -> Pod {
        let api: Api<Pod> = Api::namespaced(self.client(), ns);
        for _ in 0..100 {
            if let Some(pod) = api.get_opt(name).await.expect("get") {
                return pod;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("Pod {ns}/{name} was never made");
    }

    /// Waits until ShadowPod `ns/name` has `phase`; returns it.
    async fn wait_shadow(&self, ns: &str, name: &str, phase: &str) -> ShadowPod {
        let api: Api<ShadowPod> = Api::namespaced(self.client(), ns);
        let mut last = None;
        for _ in 0..100 {
            last = api.get_opt(name).await.expect("get");
            if last
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some(phase)
            {
                return last.expect("present");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("ShadowPod {ns}/{name} never reached {phase}: {last:#?}");
    }

    async fn stop(self) {
        self.stop.cancel();
        self.cluster.shutdown().await;
    }
}

fn tenant_ns() -> String {
    names::tenant_namespace(&ClusterId::new(CONSUMER).expect("id"))
}

fn quantities(list: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

fn namespace(name: &str, l: BTreeMap<String, String>) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(l),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// One container; with `cpu`, requests and limits of that cpu and 256Mi.
fn pod_spec(cpu: Option<&str>) -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "app".into(),
            image: Some("busybox".into()),
            resources: cpu.map(|cpu| {
                let r = quantities(&[("cpu", cpu), ("memory", "256Mi")]);
                ResourceRequirements {
                    requests: Some(r.clone()),
                    limits: Some(r),
                    ..Default::default()
                }
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    api.create(&PostParams::default(), obj)
        .await
        .unwrap_or_else(|e| panic!("creating {} {:?}: {e}", K::kind(&()), obj.meta().name))
}

fn ready(conds: &[cond::Condition]) -> (String, String) {
    let c = cond::find(conds, cond::types::READY).expect("a Ready condition");
    (c.status.clone(), c.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_namespace_is_made_bound_refused_when_taken_and_removed_with_its_request() {
    let p = Provider::start().await;
    let client = p.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());

    p.request("shop", NamespaceMappingStrategy::DefaultName)
        .await;
    let req = p.wait_request("shop", "Ready").await;
    let status = req.status.expect("status");
    assert_eq!(status.remote_namespace_name.as_deref(), Some("shop-c1"));
    assert_eq!(
        ready(&status.conditions),
        ("True".to_owned(), "TwinReady".to_owned())
    );
    let twin = namespaces.get("shop-c1").await.expect("twin namespace");
    let l = twin.metadata.labels.expect("labels");
    assert_eq!(
        l.get(labels::REMOTE_CLUSTER_ID).map(String::as_str),
        Some(CONSUMER)
    );
    assert_eq!(
        l.get(labels::ORIGIN_NAMESPACE).map(String::as_str),
        Some("shop")
    );
    assert_eq!(
        l.get(labels::MANAGED_BY).map(String::as_str),
        Some("tether")
    );
    let binding = Api::<RoleBinding>::namespaced(client.clone(), "shop-c1")
        .get(objects::TENANT_ROLE)
        .await
        .expect("binding in the twin");
    assert_eq!(binding.role_ref.name, objects::TENANT_OFFLOADED_ROLE);
    let subjects = binding.subjects.expect("subjects");
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("User", "tether:consumer:c1")
    );

    // A namespace someone else made is never taken over.
    create(
        &namespaces,
        &namespace("taken", BTreeMap::from([("team".into(), "a".into())])),
    )
    .await;
    p.request("taken", NamespaceMappingStrategy::EnforceSameName)
        .await;
    let refused = p.wait_request("taken", "Failed").await;
    let status = refused.status.expect("status");
    let c = cond::find(&status.conditions, cond::types::READY).expect("ready");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NamespaceTaken")
    );
    assert!(
        c.message.contains("taken") && c.message.contains("SelectedName"),
        "{}",
        c.message
    );

    // Removing the requests: the twin goes, the other namespace stays as it was.
    let requests: Api<NamespaceOffloading> = Api::namespaced(client.clone(), &tenant_ns());
    for name in ["shop", "taken"] {
        requests
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete request");
    }
    assert_eventually_async!(
        namespaces.get_opt("shop-c1").await.expect("get").is_none()
            && requests.get_opt("shop").await.expect("get").is_none()
            && requests.get_opt("taken").await.expect("get").is_none(),
        Duration::from_secs(15),
        "waiting"
    );
    let kept = namespaces.get("taken").await.expect("still there");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert_eq!(
        kept.metadata
            .labels
            .expect("labels")
            .get(labels::ORIGIN_NAMESPACE),
        None
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_pods_run_within_the_grant_mirror_their_pod_and_come_back_when_deleted() {
    let p = Provider::start().await;
    let client = p.client();
    p.request("shop", NamespaceMappingStrategy::DefaultName)
        .await;
    p.wait_request("shop", "Ready").await;
    let twin = "shop-c1";
    let pods: Api<Pod> = Api::namespaced(client.clone(), twin);

    // Within the grant (cpu 2): 1 + 1. A starting pod's progress reaches the ShadowPod only
    // every 30 s, so the Pod is what shows the admission.
    p.shadow_pod(twin, "a", Some("1")).await;
    let pod = p.wait_pod(twin, "a").await;
    let a = Api::<ShadowPod>::namespaced(client.clone(), twin)
        .get("a")
        .await
        .expect("ShadowPod a");
    let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("ShadowPod", "a", Some(true))
    );
    assert_eq!(Some(&owner.uid), a.metadata.uid.as_ref());
    let pl = pod.metadata.labels.clone().expect("labels");
    assert_eq!(pl.get("app").map(String::as_str), Some("a"));
    assert_eq!(
        pl.get(labels::TETHER_MANAGED_BY).map(String::as_str),
        Some(labels::SHADOW_POD)
    );
    p.shadow_pod(twin, "b", Some("1")).await;
    p.wait_pod(twin, "b").await;

    // Beyond it: refused with the figures, and no Pod.
    p.shadow_pod(twin, "c", Some("500m")).await;
    let c = p.wait_shadow(twin, "c", "Rejected").await;
    let st = c.status.expect("status");
    let rc = cond::find(&st.conditions, cond::types::READY).expect("ready");
    assert_eq!(
        (rc.status.as_str(), rc.reason.as_str()),
        ("False", "QuotaExceeded")
    );
    assert!(rc.message.contains("cpu"), "{}", rc.message);
    assert!(pods.get_opt("c").await.expect("get").is_none());
    // Soft enforcement wants requests.
    p.shadow_pod(twin, "d", None).await;
    let d = p.wait_shadow(twin, "d", "Rejected").await;
    assert_eq!(
        ready(&d.status.expect("status").conditions).1,
        "MissingRequests"
    );

    // The Pod's status, as a kubelet would write it, flows back.
    let mut running = pods.get("a").await.expect("pod a");
    running.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.244.1.7".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    pods.replace_status("a", &PostParams::default(), &running)
        .await
        .expect("pod status");
    let a = p.wait_shadow(twin, "a", "Running").await;
    let st = a.status.expect("status");
    assert_eq!(
        st.pod.as_ref().and_then(|s| s.pod_ip.as_deref()),
        Some("10.244.1.7")
    );
    assert_eq!(ready(&st.conditions).0, "True");

    // Reported, so marked for the consumer's watch; a mark removed by hand comes back with
    // the next report.
    let shadows: Api<ShadowPod> = Api::namespaced(client.clone(), twin);
    let marked = || async {
        shadows
            .get("a")
            .await
            .expect("shadow a")
            .labels()
            .contains_key(labels::STATUS_REPORTED)
    };
    assert_eventually_async!(marked().await, Duration::from_secs(10), "marked reported");
    let unmark = serde_json::json!({"metadata": {"labels": {labels::STATUS_REPORTED: null}}});
    shadows
        .patch("a", &PatchParams::default(), &Patch::Merge(&unmark))
        .await
        .expect("unmark");
    assert!(!marked().await);
    // Readiness lost is reported at once (a starting pod's routine steps wait).
    let mut unready = pods.get("a").await.expect("pod a");
    if let Some(c) = unready
        .status
        .as_mut()
        .and_then(|st| st.conditions.as_mut())
        .and_then(|cs| cs.first_mut())
    {
        c.status = "False".into();
    }
    pods.replace_status("a", &PostParams::default(), &unready)
        .await
        .expect("pod status");
    assert_eventually_async!(marked().await, Duration::from_secs(10), "marked again");

    // Deleted by someone else: made again, as a new Pod.
    let first_uid = pods.get("a").await.expect("pod a").metadata.uid;
    pods.delete("a", &DeleteParams::default())
        .await
        .expect("delete pod");
    assert_eventually_async!(
        pods.get_opt("a")
            .await
            .expect("get")
            .is_some_and(|p| p.metadata.uid != first_uid && p.metadata.deletion_timestamp.is_none()),
        Duration::from_secs(10),
        "waiting"
    );

    // A new image is carried by an update of the same Pod; any other change by a new Pod.
    let current = || async {
        pods.get_opt("a")
            .await
            .expect("get")
            .filter(|p| p.metadata.deletion_timestamp.is_none())
    };
    let before = current().await.expect("pod a");
    let mut sp = shadows.get("a").await.expect("shadow a");
    sp.spec.pod.containers[0].image = Some("busybox:2".into());
    shadows
        .replace("a", &PostParams::default(), &sp)
        .await
        .expect("new image");
    assert_eventually_async!(
        current().await.is_some_and(|p| {
            p.metadata.uid == before.metadata.uid
                && p.spec
                    .and_then(|s| s.containers[0].image.clone())
                    .as_deref()
                    == Some("busybox:2")
        }),
        Duration::from_secs(10),
        "the image changes in place"
    );
    let mut sp = shadows.get("a").await.expect("shadow a");
    sp.spec.pod.containers[0].args = Some(vec!["sleep".into(), "60".into()]);
    shadows
        .replace("a", &PostParams::default(), &sp)
        .await
        .expect("new args");
    assert_eventually_async!(
        current().await.is_some_and(|p| {
            p.metadata.uid != before.metadata.uid
                && p.spec.and_then(|s| s.containers[0].args.clone())
                    == Some(vec!["sleep".to_owned(), "60".to_owned()])
        }),
        Duration::from_secs(10),
        "a new Pod carries the new arguments"
    );

    // The consumer's identity holds pods only as ShadowPods, and only in its twin.
    let consumer = p.as_consumer().await;
    let direct = Api::<Pod>::namespaced(consumer.clone(), twin)
        .create(
            &PostParams::default(),
            &Pod {
                metadata: ObjectMeta {
                    name: Some("direct".into()),
                    ..Default::default()
                },
                spec: Some(pod_spec(Some("100m"))),
                status: None,
            },
        )
        .await;
    assert!(
        matches!(&direct, Err(kube::Error::Api(e)) if e.code == 403),
        "{direct:?}"
    );
    assert_eq!(
        Api::<Pod>::namespaced(consumer.clone(), twin)
            .get("a")
            .await
            .expect("the consumer reads its pods")
            .metadata
            .name
            .as_deref(),
        Some("a")
    );
    // A ShadowPod in the tenant namespace (the tenant role allows writing it there) is not
    // run: only twins hold workloads.
    p.shadow_pod(&tenant_ns(), "stray", Some("100m")).await;
    let stray = p.wait_shadow(&tenant_ns(), "stray", "Rejected").await;
    assert_eq!(
        ready(&stray.status.expect("status").conditions).1,
        "WrongNamespace"
    );
    assert!(
        Api::<Pod>::namespaced(client.clone(), &tenant_ns())
            .get_opt("stray")
            .await
            .expect("get")
            .is_none()
    );

    // The request goes: the twin and its pods with it.
    Api::<NamespaceOffloading>::namespaced(client.clone(), &tenant_ns())
        .delete("shop", &DeleteParams::default())
        .await
        .expect("delete request");
    assert_eventually_async!(
        Api::<Namespace>::all(client.clone())
            .get_opt(twin)
            .await
            .expect("get")
            .is_none(),
        Duration::from_secs(15),
        "waiting"
    );
    p.stop().await;
}
