//! Removes UDP conntrack entries that still send a Service's traffic to an endpoint the rules
//! no longer have, as kube-proxy does: NAT is decided on a flow's first packet only, and a
//! UDP client that keeps sending (WireGuard keepalives, DNS from one socket) refreshes its entry
//! forever, so without this it would never reach the new endpoints.
//!
//! Speaks ctnetlink (`NETLINK_NETFILTER`) directly: dump the IPv4 table, delete the flows whose
//! reply comes from a removed endpoint after a DNAT. The socket is opened on the calling thread,
//! which must be in the node namespace. Encoding and parsing are pure and unit-tested.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

use super::ProxyError;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const AF_INET: u8 = 2;
/// IANA protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// One direction of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

/// A conntrack entry: protocol and both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// IP protocol number.
    pub proto: u8,
    /// As the first packet was seen (before NAT).
    pub orig: Tuple,
    /// As replies are expected (after NAT: the source is the real endpoint).
    pub reply: Tuple,
}

impl Flow {
    /// Whether neither address nor port was translated (the reply is the mirror image).
    pub fn untranslated(&self) -> bool {
        self.reply.src == self.orig.dst
            && self.reply.dst == self.orig.src
            && self.reply.sport == self.orig.dport
            && self.reply.dport == self.orig.sport
    }

    /// Whether this UDP flow was set up without NAT towards `frontend`, an address (or, with
    /// `None`, any address) and port that now has a Service behind it: it would bypass the
    /// Service for as long as its client keeps sending.
    pub fn udp_untranslated_to(&self, frontend: (Option<Ipv4Addr>, u16)) -> bool {
        self.proto == IPPROTO_UDP
            && self.untranslated()
            && self.orig.dport == frontend.1
            && frontend.0.is_none_or(|ip| ip == self.orig.dst)
    }

    /// Whether this flow was DNATed to `target` (`ip`, `port`) over UDP.
    pub fn udp_nat_to(&self, target: (Ipv4Addr, u16)) -> bool {
        self.proto == IPPROTO_UDP
            && (self.reply.src, self.reply.sport) == target
            && (self.orig.dst, self.orig.dport) != target
    }
}

/// A parsed netlink message of interest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A conntrack entry of a dump.
    Flow(Flow),
    /// The end of a dump.
    Done,
    /// An error (negative errno) or, with 0, an acknowledgement.
    Error(i32),
    /// Anything else.
    Other,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn push_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = u16::try_from(4 + payload.len()).expect("invariant: attributes are small");
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(align4(buf.len()), 0);
}

fn nested(kind: u16, build: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut inner = Vec::new();
    build(&mut inner);
    let mut out = Vec::new();
    push_attr(&mut out, kind | NLA_F_NESTED, &inner);
    out
}

fn message(kind: u16, flags: u16, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let len = u32::try_from(16 + 4 + attrs.len()).expect("invariant: messages are small");
    let mut buf = Vec::with_capacity(20 + attrs.len());
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version 0, resource id 0 (big endian).
    buf.extend_from_slice(&[AF_INET, 0, 0, 0]);
    buf.extend_from_slice(attrs);
    buf
}

/// A request to dump the IPv4 conntrack table.
pub fn encode_dump(seq: u32) -> Vec<u8> {
    message(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, &[])
}

/// A request to delete `flow` (by its original tuple), acknowledged.
pub fn encode_delete(seq: u32, flow: &Flow) -> Vec<u8> {
    let t = flow.orig;
    let attrs = nested(CTA_TUPLE_ORIG, |b| {
        b.extend(nested(CTA_TUPLE_IP, |ip| {
            push_attr(ip, CTA_IP_V4_SRC, &t.src.octets());
            push_attr(ip, CTA_IP_V4_DST, &t.dst.octets());
        }));
        b.extend(nested(CTA_TUPLE_PROTO, |p| {
            push_attr(p, CTA_PROTO_NUM, &[flow.proto]);
            push_attr(p, CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
            push_attr(p, CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
        }));
    });
    message(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq, &attrs)
}

/// The attributes in `buf` as `(type, payload)`.
fn attrs(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            break;
        }
        out.push((kind, &buf[4..len]));
        buf = &buf[align4(len).min(buf.len())..];
    }
    out
}

fn find(attrs: &[(u16, &'_ [u8])], kind: u16) -> Option<Vec<u8>> {
    attrs
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v.to_vec())
}

fn parse_tuple(payload: &[u8]) -> Option<(u8, Tuple)> {
    let top = attrs(payload);
    let ip = find(&top, CTA_TUPLE_IP)?;
    let ip = attrs(&ip);
    let proto = find(&top, CTA_TUPLE_PROTO)?;
    let proto = attrs(&proto);
    let v4 = |kind| -> Option<Ipv4Addr> {
        let v: [u8; 4] = find(&ip, kind)?.try_into().ok()?;
        Some(Ipv4Addr::from(v))
    };
    let port = |kind| -> u16 {
        find(&proto, kind)
            .and_then(|v| <[u8; 2]>::try_from(v).ok())
            .map(u16::from_be_bytes)
            .unwrap_or(0)
    };
    let number = *find(&proto, CTA_PROTO_NUM)?.first()?;
    Some((
        number,
        Tuple {
            src: v4(CTA_IP_V4_SRC)?,
            dst: v4(CTA_IP_V4_DST)?,
            sport: port(CTA_PROTO_SRC_PORT),
            dport: port(CTA_PROTO_DST_PORT),
        },
    ))
}

/// Splits a datagram from the kernel into messages.
pub fn parse(mut buf: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = usize::try_from(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]))
            .unwrap_or(usize::MAX);
        if len < 16 || len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let body = &buf[16..len];
        let msg = match kind {
            NLMSG_DONE => Message::Done,
            NLMSG_ERROR if body.len() >= 4 => {
                Message::Error(i32::from_ne_bytes([body[0], body[1], body[2], body[3]]))
            }
            _ if kind >> 8 == NFNL_SUBSYS_CTNETLINK && body.len() >= 4 => {
                let top = attrs(&body[4..]);
                let orig = find(&top, CTA_TUPLE_ORIG).and_then(|p| parse_tuple(&p));
                let reply = find(&top, CTA_TUPLE_REPLY).and_then(|p| parse_tuple(&p));
                match (orig, reply) {
                    (Some((proto, orig)), Some((_, reply))) => {
                        Message::Flow(Flow { proto, orig, reply })
                    }
                    _ => Message::Other,
                }
            }
            _ => Message::Other,
        };
        out.push(msg);
        buf = &buf[align4(len).min(buf.len())..];
    }
    out
}

struct Socket {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Socket {
    fn open() -> Result<Self, String> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(|e| format!("open a ctnetlink socket: {e}"))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
            .map_err(|e| format!("bind the ctnetlink socket: {e}"))?;
        // Never hang the proxy on a kernel that does not answer.
        setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &TimeVal::from(libc::timeval {
                tv_sec: 2,
                tv_usec: 0,
            }),
        )
        .map_err(|e| format!("set the ctnetlink timeout: {e}"))?;
        Ok(Self {
            fd,
            buf: vec![0; 1 << 16],
        })
    }

    fn send(&self, msg: &[u8]) -> Result<(), String> {
        send(self.fd.as_raw_fd(), msg, MsgFlags::empty())
            .map(drop)
            .map_err(|e| format!("send to ctnetlink: {e}"))
    }

    fn recv(&mut self) -> Result<Vec<Message>, String> {
        let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())
            .map_err(|e| format!("receive from ctnetlink: {e}"))?;
        Ok(parse(&self.buf[..n]))
    }
}

/// Deletes every flow `stale` selects; returns how many were deleted. Runs on the calling
/// thread (its network namespace is the one cleaned).
pub fn clear_flows(stale: impl Fn(&Flow) -> bool) -> Result<usize, ProxyError> {
    let fail = |message: String| ProxyError::Conntrack(message);
    let mut socket = Socket::open().map_err(fail)?;
    socket.send(&encode_dump(1)).map_err(fail)?;
    let mut found = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    'dump: loop {
        for msg in socket.recv().map_err(fail)? {
            match msg {
                Message::Flow(flow) if stale(&flow) => found.push(flow),
                Message::Done => break 'dump,
                Message::Error(code) if code != 0 => {
                    return Err(fail(format!(
                        "conntrack dump failed: {}",
                        std::io::Error::from_raw_os_error(-code)
                    )));
                }
                _ => {}
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(fail("conntrack dump did not finish in 5 s".to_owned()));
        }
    }
    let mut deleted = 0;
    for (seq, flow) in (2u32..).zip(&found) {
        socket.send(&encode_delete(seq, flow)).map_err(fail)?;
        match socket.recv().map_err(fail)?.first() {
            Some(Message::Error(0)) => deleted += 1,
            // Gone in between: what we wanted.
            Some(Message::Error(code)) if -code == libc::ENOENT => {}
            Some(Message::Error(code)) => {
                return Err(fail(format!(
                    "delete conntrack entry {flow:?}: {}",
                    std::io::Error::from_raw_os_error(-code)
                )));
            }
            other => {
                return Err(fail(format!(
                    "unexpected ctnetlink answer to a delete: {other:?}"
                )));
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Flow {
        Flow {
            proto: IPPROTO_UDP,
            orig: Tuple {
                src: Ipv4Addr::new(198, 18, 99, 1),
                dst: Ipv4Addr::new(198, 19, 0, 5),
                sport: 40_000,
                dport: 53,
            },
            reply: Tuple {
                src: Ipv4Addr::new(10, 244, 7, 3),
                dst: Ipv4Addr::new(10, 244, 7, 1),
                sport: 7000,
                dport: 40_000,
            },
        }
    }

    /// A dump answer as the kernel writes it: header, nfgenmsg, both tuples (plus an
    /// attribute the parser must skip), followed by DONE.
    fn kernel_answer(flow: &Flow) -> Vec<u8> {
        let tuple = |kind, t: Tuple| {
            nested(kind, |b| {
                b.extend(nested(CTA_TUPLE_IP, |ip| {
                    push_attr(ip, CTA_IP_V4_SRC, &t.src.octets());
                    push_attr(ip, CTA_IP_V4_DST, &t.dst.octets());
                }));
                b.extend(nested(CTA_TUPLE_PROTO, |p| {
                    push_attr(p, CTA_PROTO_NUM, &[flow.proto]);
                    push_attr(p, CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
                    push_attr(p, CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
                }));
            })
        };
        let mut attrs = tuple(CTA_TUPLE_ORIG, flow.orig);
        attrs.extend(tuple(CTA_TUPLE_REPLY, flow.reply));
        push_attr(&mut attrs, 3, &0x1a0u32.to_be_bytes());
        let mut out = message(0, 0x2, 1, &attrs);
        let mut done = Vec::new();
        done.extend_from_slice(&20u32.to_ne_bytes());
        done.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        done.extend_from_slice(&0x2u16.to_ne_bytes());
        done.extend_from_slice(&[0; 12]);
        out.extend(done);
        out
    }

    #[test]
    fn dump_answers_parse_into_flows() {
        let f = flow();
        assert_eq!(
            parse(&kernel_answer(&f)),
            vec![Message::Flow(f), Message::Done]
        );
        assert!(parse(&[1, 2, 3]).is_empty(), "a short datagram is ignored");
    }

    #[test]
    fn only_udp_flows_natted_to_the_target_match() {
        let f = flow();
        assert!(f.udp_nat_to((Ipv4Addr::new(10, 244, 7, 3), 7000)));
        assert!(!f.udp_nat_to((Ipv4Addr::new(10, 244, 7, 3), 7001)));
        let tcp = Flow { proto: 6, ..f };
        assert!(!tcp.udp_nat_to((Ipv4Addr::new(10, 244, 7, 3), 7000)));
        // Talking to the pod directly is no NAT: left alone.
        let direct = Flow {
            orig: Tuple {
                dst: Ipv4Addr::new(10, 244, 7, 3),
                dport: 7000,
                ..f.orig
            },
            ..f
        };
        assert!(!direct.udp_nat_to((Ipv4Addr::new(10, 244, 7, 3), 7000)));
    }

    #[test]
    fn untranslated_flows_to_a_new_frontend_match() {
        let vip = Ipv4Addr::new(198, 19, 0, 5);
        let client = Ipv4Addr::new(198, 18, 99, 1);
        let orig = Tuple {
            src: client,
            dst: vip,
            sport: 41_000,
            dport: 53,
        };
        let mirror = Tuple {
            src: vip,
            dst: client,
            sport: 53,
            dport: 41_000,
        };
        let plain = Flow {
            proto: IPPROTO_UDP,
            orig,
            reply: mirror,
        };
        assert!(plain.untranslated());
        assert!(plain.udp_untranslated_to((Some(vip), 53)));
        assert!(
            plain.udp_untranslated_to((None, 53)),
            "a node port matches any address"
        );
        assert!(!plain.udp_untranslated_to((Some(vip), 54)));
        assert!(!plain.udp_untranslated_to((Some(client), 53)));
        assert!(
            !flow().untranslated(),
            "a DNATed flow is left to the endpoint check"
        );
        assert!(!flow().udp_untranslated_to((None, 53)));
    }

    #[test]
    fn delete_names_the_original_tuple() {
        let msg = encode_delete(7, &flow());
        let parsed_len = u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]);
        assert_eq!(usize::try_from(parsed_len).expect("len"), msg.len());
        assert_eq!(
            u16::from_ne_bytes([msg[4], msg[5]]),
            (1 << 8) | IPCTNL_MSG_CT_DELETE
        );
        assert_eq!(
            u16::from_ne_bytes([msg[6], msg[7]]),
            NLM_F_REQUEST | NLM_F_ACK
        );
        let top = attrs(&msg[20..]);
        assert_eq!(top.len(), 1);
        let (proto, tuple) = parse_tuple(top[0].1).expect("tuple");
        assert_eq!((proto, tuple), (IPPROTO_UDP, flow().orig));
        let dump = encode_dump(1);
        assert_eq!(dump.len(), 20);
        assert_eq!(
            u16::from_ne_bytes([dump[6], dump[7]]),
            NLM_F_REQUEST | NLM_F_DUMP
        );
    }
}
