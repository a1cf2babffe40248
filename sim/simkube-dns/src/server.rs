//! The IO around the pure schema: two reflectors keep Services and EndpointSlices in memory,
//! and a hickory request handler answers each parsed query from them. hickory owns the wire
//! format, the UDP and TCP listeners, and truncation to the client's EDNS payload size; the
//! 512-byte limit of clients without EDNS is kept here, as hickory allows them more.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use hickory_proto::op::{Edns, Header, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, RecordType};
use hickory_proto::xfer::Protocol;
use hickory_server::ServerFuture;
use hickory_server::authority::MessageResponseBuilder;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Resource, ResourceExt as _};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lookup::{Answer, Zone};
use crate::metrics::Metrics;
use crate::view::ClusterView;
use crate::{DnsConfig, DnsError};

/// How long an idle TCP connection is kept open (CoreDNS's read timeout).
const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest UDP message a client without EDNS accepts (RFC 1035, section 4.2.1).
const CLASSIC_UDP_LIMIT: usize = 512;

pub(crate) async fn serve(
    client: kube::Client,
    config: DnsConfig,
    udp: UdpSocket,
    tcp: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), DnsError> {
    let zone = Zone::new(&config.domain, config.ttl).map_err(|reason| DnsError::InvalidDomain {
        domain: config.domain.clone(),
        reason,
    })?;
    // The serial starts at the wall clock so it keeps growing across restarts, and counts every
    // change seen after that, as a zone's serial should.
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let serial = Arc::new(AtomicU32::new(u32::try_from(start).unwrap_or(u32::MAX / 2)));
    let (services, services_writer) = reflector::store::<Service>();
    let (slices, slices_writer) = reflector::store::<EndpointSlice>();
    let synced = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    let mut watches = JoinSet::new();
    watches.spawn(watch(
        Api::<Service>::all(client.clone()),
        services_writer,
        Watch {
            resource: "services",
            synced: synced[0].clone(),
            serial: serial.clone(),
            metrics: config.metrics.clone(),
        },
    ));
    watches.spawn(watch(
        Api::<EndpointSlice>::all(client),
        slices_writer,
        Watch {
            resource: "endpointslices",
            synced: synced[1].clone(),
            serial: serial.clone(),
            metrics: config.metrics.clone(),
        },
    ));

    let udp_addr = udp.local_addr().ok();
    let tcp_addr = tcp.local_addr().ok();
    let mut server = ServerFuture::new(Handler {
        zone,
        view: ClusterView::new(services, slices),
        synced,
        serial,
        metrics: config.metrics,
        rotation: AtomicUsize::new(0),
    });
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE_TIMEOUT);
    info!(domain = %config.domain, ?udp_addr, ?tcp_addr, "cluster DNS serving");
    let result = tokio::select! {
        () = shutdown.cancelled() => server.shutdown_gracefully().await.map_err(DnsError::Serve),
        result = server.block_until_done() => result.map_err(DnsError::Serve).and(Err(DnsError::Closed)),
    };
    // Dropping the set aborts the watches.
    drop(watches);
    info!(domain = %config.domain, "cluster DNS stopped");
    result
}

/// What one watch task reports to the rest of the server.
struct Watch {
    resource: &'static str,
    synced: Arc<AtomicBool>,
    serial: Arc<AtomicU32>,
    metrics: Metrics,
}

/// Keeps `writer`'s store current until aborted; errors are retried with back-off and counted.
async fn watch<K>(api: Api<K>, writer: reflector::store::Writer<K>, report: Watch)
where
    K: Resource
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        // Managed fields and annotations (kubectl's last-applied copy) are most of an object's
        // size, and no answer reads them.
        .modify(|object: &mut K| {
            object.managed_fields_mut().clear();
            object.annotations_mut().clear();
        })
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::InitDone) => {
                report.serial.fetch_add(1, Ordering::Relaxed);
                if !report.synced.swap(true, Ordering::Release) {
                    report.metrics.watch_synced(report.resource);
                    info!(resource = report.resource, "watch synced");
                }
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                report.serial.fetch_add(1, Ordering::Relaxed);
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(error) => {
                report.metrics.watch_error(report.resource);
                warn!(resource = report.resource, %error, "watch failed; retrying");
            }
        }
    }
}

struct Handler {
    zone: Zone,
    view: ClusterView,
    /// Services and EndpointSlices listed at least once.
    synced: [Arc<AtomicBool>; 2],
    serial: Arc<AtomicU32>,
    metrics: Metrics,
    rotation: AtomicUsize,
}

impl Handler {
    /// The type asked and the answer, or an error code for a request that is not one query.
    fn answer(&self, request: &Request) -> (RecordType, Answer) {
        if request.message_type() != MessageType::Query {
            return (RecordType::Unknown(0), Answer::code(ResponseCode::FormErr));
        }
        if request.op_code() != OpCode::Query {
            return (RecordType::Unknown(0), Answer::code(ResponseCode::NotImp));
        }
        let Ok(info) = request.request_info() else {
            return (RecordType::Unknown(0), Answer::code(ResponseCode::FormErr));
        };
        let query = info.query.original();
        let qtype = query.query_type();
        if query.query_class() != DNSClass::IN {
            return (qtype, Answer::code(ResponseCode::Refused));
        }
        let mut fqdn = query.name().clone();
        fqdn.set_fqdn(true);
        let synced = self.synced.iter().all(|s| s.load(Ordering::Acquire));
        if !synced && self.zone.covers(&fqdn) {
            // An empty cache would answer NXDOMAIN for names that exist, and clients cache that.
            return (qtype, Answer::code(ResponseCode::ServFail));
        }
        let serial = self.serial.load(Ordering::Relaxed);
        let mut answer = self.zone.lookup(&self.view, query.name(), qtype, serial);
        answer.rotate(self.rotation.fetch_add(1, Ordering::Relaxed));
        (qtype, answer)
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let started = Instant::now();
        let mut header = Header::response_from_request(request.header());
        let mut builder = MessageResponseBuilder::from_message_request(request);
        let mut bad_version = false;
        if let Some(edns) = request.edns() {
            // Echo EDNS with the client's payload size: hickory truncates UDP answers to it.
            let mut ours = Edns::new();
            ours.set_max_payload(edns.max_payload().max(512));
            ours.set_version(0);
            bad_version = edns.version() > 0;
            builder.edns(ours);
        }
        let (qtype, mut answer) = if bad_version {
            (RecordType::Unknown(0), Answer::code(ResponseCode::BADVERS))
        } else {
            self.answer(request)
        };
        if request.protocol() == Protocol::Udp && request.edns().is_none() {
            // hickory allows 4096 bytes to clients without EDNS; RFC 1035 promises them 512.
            if let Ok(info) = request.request_info() {
                let truncated = answer.fit(info.query.original(), CLASSIC_UDP_LIMIT);
                header.set_truncated(truncated);
            }
        }
        header.set_response_code(answer.rcode);
        header.set_authoritative(answer.authoritative);
        let response = builder.build(
            header,
            answer.answers.iter(),
            answer.authority.iter(),
            std::iter::empty(),
            answer.additionals.iter(),
        );
        let info = match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(error) => {
                warn!(%error, src = %request.src(), "sending a DNS response failed");
                header.set_response_code(ResponseCode::ServFail);
                header.into()
            }
        };
        debug!(
            src = %request.src(),
            qtype = %qtype,
            rcode = %answer.rcode,
            answers = answer.answers.len(),
            "query",
        );
        self.metrics
            .query(qtype, answer.rcode, started.elapsed().as_secs_f64());
        info
    }
}
