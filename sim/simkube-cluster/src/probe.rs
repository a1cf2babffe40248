//! A DNS question asked from inside a node's network namespace, as a pod there asks it: to
//! the cluster DNS Service's ClusterIP, which only answers when the node's service proxy
//! translates it and the cluster DNS serves. `cluster up` asks it on every node before it
//! reports the cluster up. hickory encodes and decodes the messages.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

/// The IPv4 addresses `server` answers for `name`, asked over UDP from the network namespace
/// at `netns`, waiting at most `timeout`. The error says what went wrong in a phrase.
pub fn resolve_a(
    netns: &Path,
    server: SocketAddrV4,
    name: &str,
    timeout: Duration,
) -> Result<Vec<Ipv4Addr>, String> {
    let netns = std::fs::File::open(netns)
        .map_err(|e| format!("cannot open the namespace {}: {e}", netns.display()))?;
    // A thread of its own enters the namespace, so that the caller's threads stay where they are.
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("cannot enter the namespace: {e}"))?;
                ask(server, name, timeout)
            })
            .join()
            .unwrap_or_else(|_| Err("the DNS probe thread panicked".to_owned()))
    })
}

fn ask(server: SocketAddrV4, name: &str, timeout: Duration) -> Result<Vec<Ipv4Addr>, String> {
    let id = u16::try_from(std::process::id() & 0xffff).unwrap_or(1);
    let query = query(id, name)?;
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| e.to_string())?;
    socket
        .send_to(&query, server)
        .map_err(|e| format!("cannot send to {server}: {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut buffer = [0u8; 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no answer from {server} within {timeout:?}"));
        }
        socket
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        let (len, from) = match socket.recv_from(&mut buffer) {
            Ok(received) => received,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => return Err(format!("no answer from {server}: {e}")),
        };
        if from != SocketAddr::V4(server) {
            // Only the address asked may answer (the service proxy translates it back).
            continue;
        }
        let answer = Message::from_vec(&buffer[..len])
            .map_err(|e| format!("{server} sent an undecodable answer: {e}"))?;
        if answer.id() == id {
            return addresses(&answer, server);
        }
    }
}

fn is_timeout(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The wire form of an A question for `name` with `id`.
fn query(id: u16, name: &str) -> Result<Vec<u8>, String> {
    let name = Name::from_ascii(name).map_err(|e| format!("bad DNS name {name:?}: {e}"))?;
    let mut message = Message::new();
    message
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name, RecordType::A));
    message.to_vec().map_err(|e| e.to_string())
}

/// The A records of `answer`, or why there are none.
fn addresses(answer: &Message, server: SocketAddrV4) -> Result<Vec<Ipv4Addr>, String> {
    if answer.response_code() != ResponseCode::NoError {
        return Err(format!("{server} answered {}", answer.response_code()));
    }
    let found: Vec<Ipv4Addr> = answer
        .answers()
        .iter()
        .filter_map(|record| match record.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    if found.is_empty() {
        return Err(format!("{server} answered without an address"));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_question_and_the_answer_use_the_dns_wire_format() {
        let wire = query(7, "kubernetes.default.svc.cluster.local").expect("encodes");
        let mut answer = Message::from_vec(&wire).expect("decodes");
        assert_eq!(answer.id(), 7);
        assert_eq!(answer.queries().len(), 1);
        let server = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 10), 53);
        assert_eq!(
            addresses(&answer, server),
            Err("10.96.0.10:53 answered without an address".to_owned())
        );
        let name = Name::from_ascii("kubernetes.default.svc.cluster.local.").expect("name");
        answer.add_answer(hickory_proto::rr::Record::from_rdata(
            name,
            5,
            RData::A(hickory_proto::rr::rdata::A(Ipv4Addr::new(10, 96, 0, 1))),
        ));
        assert_eq!(
            addresses(&answer, server),
            Ok(vec![Ipv4Addr::new(10, 96, 0, 1)])
        );
        answer.set_response_code(ResponseCode::ServFail);
        assert_eq!(
            addresses(&answer, server),
            Err("10.96.0.10:53 answered Server Failure".to_owned())
        );
        assert!(query(1, "bad..name").is_err());
    }
}
