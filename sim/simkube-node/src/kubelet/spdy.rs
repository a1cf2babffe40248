//! SPDY/3.1 framing without IO, as the kubelet's port-forward endpoint needs it: frames are
//! decoded from and encoded into byte buffers, and header blocks go through the connection's
//! two zlib contexts (one per direction, primed with the SPDY/3 dictionary). Flow control is
//! not kept: Kubernetes clients neither send nor wait for WINDOW_UPDATE.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The protocol version in every control frame.
pub const VERSION: u16 = 3;

/// FLAG_FIN: the sender's last frame on the stream.
pub const FLAG_FIN: u8 = 0x01;
/// FLAG_UNIDIRECTIONAL (SYN_STREAM): the receiver may not send on the stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

/// RST_STREAM status PROTOCOL_ERROR.
pub const RST_PROTOCOL_ERROR: u32 = 1;
/// RST_STREAM status INVALID_STREAM.
pub const RST_INVALID_STREAM: u32 = 2;
/// RST_STREAM status REFUSED_STREAM.
pub const RST_REFUSED_STREAM: u32 = 3;
/// RST_STREAM status CANCEL.
pub const RST_CANCEL: u32 = 5;

/// GOAWAY status OK.
pub const GOAWAY_OK: u32 = 0;

/// The largest payload a frame's 24-bit length can carry.
pub const MAX_PAYLOAD: usize = (1 << 24) - 1;

/// How large a decompressed header block may grow before it is refused.
const MAX_HEADER_BLOCK: usize = 1 << 20;

const HEADER_LEN: usize = 8;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// Header names (lower case) and values; a name sent with several values appears once per
/// value.
pub type Headers = Vec<(String, String)>;

/// One SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// SYN_STREAM: opens a stream.
    SynStream {
        /// The new stream's id (odd when the client opens it).
        stream_id: u32,
        /// The stream it belongs to (0 for none).
        associated_to: u32,
        /// 0 (highest) to 7.
        priority: u8,
        /// FLAG_FIN, FLAG_UNIDIRECTIONAL.
        flags: u8,
        /// The stream's headers.
        headers: Headers,
    },
    /// SYN_REPLY: accepts a stream.
    SynReply {
        /// The stream.
        stream_id: u32,
        /// FLAG_FIN.
        flags: u8,
        /// Reply headers.
        headers: Headers,
    },
    /// RST_STREAM: ends a stream abnormally.
    RstStream {
        /// The stream.
        stream_id: u32,
        /// Why (`RST_*`).
        status: u32,
    },
    /// SETTINGS.
    Settings {
        /// FLAG_SETTINGS_CLEAR_SETTINGS.
        flags: u8,
        /// (flags, id, value) per entry.
        entries: Vec<(u8, u32, u32)>,
    },
    /// PING: answered with the same id.
    Ping {
        /// The id.
        id: u32,
    },
    /// GOAWAY: no new streams.
    GoAway {
        /// The last stream the sender accepted.
        last_good_stream_id: u32,
        /// Why (`GOAWAY_*`).
        status: u32,
    },
    /// HEADERS: more headers for a stream.
    Headers {
        /// The stream.
        stream_id: u32,
        /// FLAG_FIN.
        flags: u8,
        /// The headers.
        headers: Headers,
    },
    /// WINDOW_UPDATE.
    WindowUpdate {
        /// The stream.
        stream_id: u32,
        /// How many more bytes the sender may send.
        delta: u32,
    },
    /// A data frame.
    Data {
        /// The stream.
        stream_id: u32,
        /// FLAG_FIN.
        flags: u8,
        /// The payload.
        data: Bytes,
    },
    /// A control frame of a type this codec does not know (skipped, as the spec says).
    Unknown {
        /// Its type.
        kind: u16,
    },
}

/// What made a frame unreadable or unwritable; all of them end the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpdyError {
    /// A control frame of another version.
    #[error("unsupported SPDY version {0} (only 3 is spoken)")]
    Version(u16),
    /// A frame shorter than its type needs.
    #[error("SPDY frame of type {kind} is {len} bytes long, too short")]
    Short {
        /// The control frame type.
        kind: u16,
        /// Its payload length.
        len: usize,
    },
    /// A header block that does not decompress.
    #[error("SPDY header block: {0}")]
    Compression(String),
    /// A decompressed header block that does not parse.
    #[error("SPDY header block is malformed: {0}")]
    HeaderBlock(String),
    /// A frame too large to encode.
    #[error("SPDY frame payload of {0} bytes exceeds the 24-bit length")]
    TooLarge(usize),
}

/// The SPDY/3 header compression dictionary: the length-prefixed words, then the raw tail
/// (SPDY/3 draft, section 2.6.10.1).
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICTIONARY.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411412\
            413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved \
            Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal \
            Server Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul \
            Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,\
            text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,\
            text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8\
            charset=iso-8859-1,utf-,*,enq=0.";
        let mut out = Vec::with_capacity(1423);
        for word in WORDS {
            let len = u32::try_from(word.len()).expect("invariant: dictionary words are short");
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(word.as_bytes());
        }
        out.extend_from_slice(TAIL.as_bytes());
        out
    })
}

/// Reads frames from the bytes a peer sent, with that peer's header compression context.
pub struct Decoder {
    inflate: Decompress,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder for a new connection.
    pub fn new() -> Self {
        Self {
            inflate: Decompress::new(true),
        }
    }

    /// Takes one whole frame off the front of `buf`; `None` while `buf` holds less than a
    /// frame.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
        if buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let control = buf[0] & 0x80 != 0;
        let word = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let flags = buf[4];
        buf.advance(HEADER_LEN);
        let mut payload = buf.split_to(len).freeze();
        if !control {
            return Ok(Some(Frame::Data {
                stream_id: word & 0x7fff_ffff,
                flags,
                data: payload,
            }));
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        let kind = (word & 0xffff) as u16;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let need = |n: usize| {
            if len < n {
                Err(SpdyError::Short { kind, len })
            } else {
                Ok(())
            }
        };
        let frame = match kind {
            TYPE_SYN_STREAM => {
                need(10)?;
                let stream_id = payload.get_u32() & 0x7fff_ffff;
                let associated_to = payload.get_u32() & 0x7fff_ffff;
                let priority = payload.get_u8() >> 5;
                let _slot = payload.get_u8();
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    flags,
                    headers: self.header_block(&payload)?,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                need(4)?;
                let stream_id = payload.get_u32() & 0x7fff_ffff;
                let headers = self.header_block(&payload)?;
                if kind == TYPE_SYN_REPLY {
                    Frame::SynReply {
                        stream_id,
                        flags,
                        headers,
                    }
                } else {
                    Frame::Headers {
                        stream_id,
                        flags,
                        headers,
                    }
                }
            }
            TYPE_RST_STREAM => {
                need(8)?;
                Frame::RstStream {
                    stream_id: payload.get_u32() & 0x7fff_ffff,
                    status: payload.get_u32(),
                }
            }
            TYPE_SETTINGS => {
                need(4)?;
                let count = payload.get_u32() as usize;
                if payload.len() < count.saturating_mul(8) {
                    return Err(SpdyError::Short { kind, len });
                }
                let entries = (0..count)
                    .map(|_| {
                        let head = payload.get_u32();
                        ((head >> 24) as u8, head & 0x00ff_ffff, payload.get_u32())
                    })
                    .collect();
                Frame::Settings { flags, entries }
            }
            TYPE_PING => {
                need(4)?;
                Frame::Ping {
                    id: payload.get_u32(),
                }
            }
            TYPE_GOAWAY => {
                need(8)?;
                Frame::GoAway {
                    last_good_stream_id: payload.get_u32() & 0x7fff_ffff,
                    status: payload.get_u32(),
                }
            }
            TYPE_WINDOW_UPDATE => {
                need(8)?;
                Frame::WindowUpdate {
                    stream_id: payload.get_u32() & 0x7fff_ffff,
                    delta: payload.get_u32() & 0x7fff_ffff,
                }
            }
            other => Frame::Unknown { kind: other },
        };
        Ok(Some(frame))
    }

    /// Inflates one header block (the context carries over from the previous ones) and
    /// parses it.
    fn header_block(&mut self, compressed: &[u8]) -> Result<Headers, SpdyError> {
        let mut out: Vec<u8> = Vec::with_capacity(compressed.len() * 4 + 64);
        let mut input = compressed;
        loop {
            if out.capacity() - out.len() < 256 {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(SpdyError::Compression(format!(
                        "larger than {MAX_HEADER_BLOCK} bytes"
                    )));
                }
                out.reserve(out.len().max(1024));
            }
            let before_in = self.inflate.total_in();
            let before_out = out.len();
            let result = self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let consumed = usize::try_from(self.inflate.total_in() - before_in)
                .expect("invariant: consumed input fits in memory");
            input = &input[consumed..];
            match result {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {
                    let progressed = consumed > 0 || out.len() > before_out;
                    let room_left = out.capacity() > out.len();
                    if input.is_empty() && room_left {
                        break;
                    }
                    if !progressed && room_left {
                        return Err(SpdyError::Compression(
                            "the compressed block ends in the middle".to_owned(),
                        ));
                    }
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| SpdyError::Compression(e.to_string()))?;
                }
                Err(e) => return Err(SpdyError::Compression(e.to_string())),
            }
        }
        parse_header_block(&out)
    }
}

fn parse_header_block(mut block: &[u8]) -> Result<Headers, SpdyError> {
    fn take<'a>(block: &mut &'a [u8], what: &str) -> Result<&'a [u8], SpdyError> {
        if block.len() < 4 {
            return Err(SpdyError::HeaderBlock(format!(
                "the length of {what} is cut off"
            )));
        }
        let len = u32::from_be_bytes([block[0], block[1], block[2], block[3]]) as usize;
        *block = &block[4..];
        if block.len() < len {
            return Err(SpdyError::HeaderBlock(format!(
                "{what} is {len} bytes long but only {} remain",
                block.len()
            )));
        }
        let (value, rest) = block.split_at(len);
        *block = rest;
        Ok(value)
    }
    if block.len() < 4 {
        return Err(SpdyError::HeaderBlock("no pair count".to_owned()));
    }
    let count = u32::from_be_bytes([block[0], block[1], block[2], block[3]]);
    block = &block[4..];
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = take(&mut block, "a header name")?;
        let value = take(&mut block, "a header value")?;
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        // Several values of one name travel NUL-separated in one pair.
        for part in value.split(|b| *b == 0) {
            headers.push((name.clone(), String::from_utf8_lossy(part).into_owned()));
        }
    }
    Ok(headers)
}

/// Writes frames for a peer, with this side's header compression context.
pub struct Encoder {
    deflate: Compress,
    primed: bool,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    /// An encoder for a new connection.
    pub fn new() -> Self {
        Self {
            deflate: Compress::new(Compression::default(), true),
            primed: false,
        }
    }

    /// Appends `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), SpdyError> {
        let mut payload = BytesMut::new();
        let (kind, flags) = match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let len = length(data.len())?;
                out.put_u32(stream_id & 0x7fff_ffff);
                out.put_u32((u32::from(*flags) << 24) | len);
                out.extend_from_slice(data);
                return Ok(());
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                payload.put_u32(stream_id & 0x7fff_ffff);
                payload.put_u32(associated_to & 0x7fff_ffff);
                payload.put_u8((priority & 0x07) << 5);
                payload.put_u8(0);
                self.header_block(headers, &mut payload)?;
                (TYPE_SYN_STREAM, *flags)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            } => {
                payload.put_u32(stream_id & 0x7fff_ffff);
                self.header_block(headers, &mut payload)?;
                (TYPE_SYN_REPLY, *flags)
            }
            Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                payload.put_u32(stream_id & 0x7fff_ffff);
                self.header_block(headers, &mut payload)?;
                (TYPE_HEADERS, *flags)
            }
            Frame::RstStream { stream_id, status } => {
                payload.put_u32(stream_id & 0x7fff_ffff);
                payload.put_u32(*status);
                (TYPE_RST_STREAM, 0)
            }
            Frame::Settings { flags, entries } => {
                payload.put_u32(length(entries.len())?);
                for (entry_flags, id, value) in entries {
                    payload.put_u32((u32::from(*entry_flags) << 24) | (id & 0x00ff_ffff));
                    payload.put_u32(*value);
                }
                (TYPE_SETTINGS, *flags)
            }
            Frame::Ping { id } => {
                payload.put_u32(*id);
                (TYPE_PING, 0)
            }
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                payload.put_u32(last_good_stream_id & 0x7fff_ffff);
                payload.put_u32(*status);
                (TYPE_GOAWAY, 0)
            }
            Frame::WindowUpdate { stream_id, delta } => {
                payload.put_u32(stream_id & 0x7fff_ffff);
                payload.put_u32(delta & 0x7fff_ffff);
                (TYPE_WINDOW_UPDATE, 0)
            }
            Frame::Unknown { kind } => (*kind, 0),
        };
        let len = length(payload.len())?;
        out.put_u16(0x8000 | VERSION);
        out.put_u16(kind);
        out.put_u32((u32::from(flags) << 24) | len);
        out.extend_from_slice(&payload);
        Ok(())
    }

    /// Deflates `headers` as one block ending on a sync flush (the context carries over).
    fn header_block(&mut self, headers: &Headers, out: &mut BytesMut) -> Result<(), SpdyError> {
        if !self.primed {
            self.deflate
                .set_dictionary(dictionary())
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            self.primed = true;
        }
        // Several values of one name go NUL-separated in one pair, in first-seen order.
        let mut pairs: Vec<(String, Vec<&str>)> = Vec::new();
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            match pairs.iter_mut().find(|(n, _)| *n == name) {
                Some((_, values)) => values.push(value),
                None => pairs.push((name, vec![value])),
            }
        }
        let mut raw = Vec::new();
        raw.put_u32(length(pairs.len())?);
        for (name, values) in &pairs {
            let value = values.join("\0");
            raw.put_u32(length(name.len())?);
            raw.extend_from_slice(name.as_bytes());
            raw.put_u32(length(value.len())?);
            raw.extend_from_slice(value.as_bytes());
        }
        let mut compressed: Vec<u8> = Vec::with_capacity(raw.len() + 64);
        let mut input = raw.as_slice();
        loop {
            if compressed.capacity() - compressed.len() < 64 {
                compressed.reserve(compressed.len().max(256));
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut compressed, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            let consumed = usize::try_from(self.deflate.total_in() - before)
                .expect("invariant: consumed input fits in memory");
            input = &input[consumed..];
            // The sync flush is complete once the input is used up and the output still had
            // room after it.
            if input.is_empty() && compressed.len() < compressed.capacity() {
                break;
            }
        }
        out.extend_from_slice(&compressed);
        Ok(())
    }
}

fn length(n: usize) -> Result<u32, SpdyError> {
    if n > MAX_PAYLOAD {
        return Err(SpdyError::TooLarge(n));
    }
    Ok(u32::try_from(n).expect("invariant: checked against the 24-bit maximum"))
}

/// The first value of header `name` (lower case).
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn round_trip(frames: &[Frame]) -> Vec<Frame> {
        let mut encoder = Encoder::new();
        let mut decoder = Decoder::new();
        let mut wire = BytesMut::new();
        for frame in frames {
            encoder.encode(frame, &mut wire).expect("encode");
        }
        let mut out = Vec::new();
        while let Some(frame) = decoder.decode(&mut wire).expect("decode") {
            out.push(frame);
        }
        assert!(wire.is_empty(), "{} bytes left over", wire.len());
        out
    }

    #[test]
    fn every_frame_type_round_trips_through_one_connection_context() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: headers(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 7,
                flags: FLAG_UNIDIRECTIONAL,
                headers: headers(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::SynReply {
                stream_id: 3,
                flags: 0,
                headers: Vec::new(),
            },
            Frame::Headers {
                stream_id: 3,
                flags: FLAG_FIN,
                headers: headers(&[("x", "1"), ("x", "2"), ("y", "")]),
            },
            Frame::Data {
                stream_id: 3,
                flags: 0,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::new(),
            },
            Frame::RstStream {
                stream_id: 3,
                status: RST_CANCEL,
            },
            Frame::Settings {
                flags: 1,
                entries: vec![(0, 7, 65536), (1, 4, 100)],
            },
            Frame::Ping { id: 0x8000_0001 },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: GOAWAY_OK,
            },
            Frame::WindowUpdate {
                stream_id: 1,
                delta: 1 << 20,
            },
        ];
        assert_eq!(round_trip(&frames), frames);
    }

    #[test]
    fn header_names_are_lower_cased_and_repeated_values_share_a_pair() {
        let frames = [Frame::SynReply {
            stream_id: 1,
            flags: 0,
            headers: headers(&[("StreamType", "data"), ("Port", "80"), ("port", "81")]),
        }];
        assert_eq!(
            round_trip(&frames),
            [Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: headers(&[("streamtype", "data"), ("port", "80"), ("port", "81")]),
            }]
        );
    }

    #[test]
    fn partial_input_waits_for_the_rest_of_the_frame() {
        let mut encoder = Encoder::new();
        let mut wire = BytesMut::new();
        let frame = Frame::SynStream {
            stream_id: 5,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: headers(&[("streamtype", "data")]),
        };
        encoder.encode(&frame, &mut wire).expect("encode");
        let whole = wire.clone();
        let mut decoder = Decoder::new();
        let mut fed = BytesMut::new();
        for (i, byte) in whole.iter().enumerate() {
            fed.put_u8(*byte);
            let got = decoder.decode(&mut fed).expect("decode");
            if i + 1 < whole.len() {
                assert_eq!(
                    got,
                    None,
                    "a frame out of {} of {} bytes",
                    i + 1,
                    whole.len()
                );
            } else {
                assert_eq!(got, Some(frame.clone()));
            }
        }
    }

    #[test]
    fn the_dictionary_is_the_spdy3_one() {
        let dict = dictionary();
        assert_eq!(dict.len(), 1423);
        assert!(dict.starts_with(b"\0\0\0\x07options\0\0\0\x04head"));
        assert!(dict.ends_with(b",*,enq=0."));
        // zlib names a preset dictionary by its Adler-32 in the stream header; every SPDY/3
        // peer's first header block carries this one (see the captured frames below).
        let mut deflate = Compress::new(Compression::default(), true);
        assert_eq!(deflate.set_dictionary(dict).expect("dictionary"), ADLER);
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn sorted(mut headers: Headers) -> Headers {
        headers.sort();
        headers
    }

    /// What kubectl 1.33 sent first through `kubectl port-forward pod/echo :7000` with two
    /// connections opened at once (bytes as the kubelet read them): the error streams of
    /// requests 0 and 1, the end of the first error stream's client half, the data stream of
    /// request 0. Go's zlib names the dictionary by its Adler-32 (`e3c6a7c2`) after the
    /// stream header `78f9`, and the later blocks reuse the context.
    #[test]
    fn a_captured_kubectl_frame_sequence_decodes() {
        let captured = hex(concat!(
            "800300010000003e0000000100000000000078f9e3c6a7c202253a703a2b294a4dcc851625aca9a080",
            "8614cb45e01c606e6060c0c0c0c0590489c64c50f2663400000000ffff",
            "800300010000001300000003000000000000a244b321000000ffff",
            "0000000101000000",
            "800300010000001800000005000000000000c2aa1954882512b618000000ffff",
        ));
        let mut wire = BytesMut::from(&captured[..]);
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        while let Some(frame) = decoder.decode(&mut wire).expect("decode") {
            frames.push(match frame {
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    flags,
                    headers,
                } => Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    flags,
                    headers: sorted(headers),
                },
                other => other,
            });
        }
        assert!(wire.is_empty());
        let syn = |stream_id, kind: &str, request: &str| Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: headers(&[
                ("port", "7000"),
                ("requestid", request),
                ("streamtype", kind),
            ]),
        };
        assert_eq!(
            frames,
            [
                syn(1, "error", "0"),
                syn(3, "error", "1"),
                Frame::Data {
                    stream_id: 1,
                    flags: FLAG_FIN,
                    data: Bytes::new(),
                },
                syn(5, "data", "0"),
            ]
        );
    }

    /// The Adler-32 of the SPDY/3 dictionary, as found in the captured client header block.
    const ADLER: u32 = 0xe3c6_a7c2;

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let mut decoder = Decoder::new();
        let mut wire = BytesMut::from(&[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0][..]);
        assert_eq!(decoder.decode(&mut wire), Err(SpdyError::Version(2)));
        let mut wire = BytesMut::from(&[0x80, 0x03, 0x00, 0x03, 0, 0, 0, 4, 0, 0, 0, 1][..]);
        assert_eq!(
            decoder.decode(&mut wire),
            Err(SpdyError::Short { kind: 3, len: 4 })
        );
        let mut wire = BytesMut::from(
            &[
                0x80, 0x03, 0x00, 0x02, 0, 0, 0, 8, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef,
            ][..],
        );
        assert!(matches!(
            decoder.decode(&mut wire),
            Err(SpdyError::Compression(_))
        ));
        let unknown = BytesMut::from(&[0x80, 0x03, 0x00, 0x0a, 0, 0, 0, 2, 1, 2][..]);
        let mut wire = unknown;
        assert_eq!(
            Decoder::new().decode(&mut wire),
            Ok(Some(Frame::Unknown { kind: 10 }))
        );
    }
}
