//! HTTP/1.1 for the metadata server and the metrics endpoint: requests cut incrementally out of the
//! bytes a connection receives (head parsed with `httparse`, bodies by
//! `Content-Length` or chunked), and responses.
//!
//! Every part a client controls is bounded: the head (16 KiB, 64 header
//! fields), the body ([`Limits::max_body`], checked against the declared
//! length before the body arrives, and while a chunked body is decoded),
//! chunk-size lines, and the raw bytes of the whole request with its chunk
//! framing, extensions and trailers ([`Limits::max_request`]). A chunked
//! body is decoded in place and its framing dropped as it is decoded, so a
//! request holds its decoded body and at most one chunk not yet complete.

use crate::serve::Parse;

/// Largest request head (request line and header fields).
pub(crate) const MAX_HEAD: usize = 16 << 10;
/// Most header fields in a request head.
const MAX_HEADERS: usize = 64;
/// Longest chunk-size line (with extensions) or trailer section.
const MAX_CHUNK_LINE: usize = 4 << 10;
/// Sent when a client asks `Expect: 100-continue` before its body.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
/// Chunk framing (size lines, extensions, line ends, trailers) a request
/// may carry beyond its head and body, besides an eighth of the body limit.
const FRAMING_ALLOWANCE: usize = 64 << 10;

/// Request bounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Largest body accepted; a larger one is answered 413.
    pub max_body: usize,
    /// Largest request as sent (head, body, chunk framing and trailers);
    /// a larger one is answered 413.
    pub max_request: usize,
}

impl Limits {
    /// The bounds for bodies of at most `max_body` bytes: a request may
    /// add a head of [`MAX_HEAD`], and chunk framing of an eighth of
    /// `max_body` plus [`FRAMING_ALLOWANCE`].
    pub(crate) const fn new(max_body: usize) -> Limits {
        Limits {
            max_body,
            max_request: max_body
                .saturating_add(max_body / 8)
                .saturating_add(FRAMING_ALLOWANCE)
                .saturating_add(MAX_HEAD),
        }
    }
}

/// One complete request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// The method, as sent (`GET`, `PUT`, ...).
    pub method: String,
    /// The request target (`/metadata?key=...`).
    pub target: String,
    /// The body, decoded.
    pub body: Vec<u8>,
    /// Whether the connection stays open for another request.
    pub keep_alive: bool,
}

/// How the body of a request is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Length(usize),
    Chunked(Chunks),
}

/// Where the decoding of a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunks {
    /// Where the next chunk-size line starts in the buffer.
    read: usize,
    /// The end of the body decoded so far (in place, at the front of the
    /// buffer).
    written: usize,
    /// Bytes of the request consumed that are not body: its head and the
    /// framing of the chunks decoded.
    framing: usize,
}

/// A parsed head, waiting for its body.
#[derive(Debug)]
struct Head {
    method: String,
    target: String,
    keep_alive: bool,
    body: Body,
    expect_continue: bool,
    /// The `Authorization` header's value, if sent.
    authorization: Option<Vec<u8>>,
}

/// Per-connection parsing state: the head once it is parsed (its bytes
/// are then gone from the buffer, which holds only the body).
#[derive(Debug, Default)]
pub(crate) struct Parser {
    head: Option<Head>,
}

/// The reason phrase of the status codes the server sends.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Unknown",
    }
}

/// Encodes a response with a JSON content type (as Mooncake's Go server
/// sends), `Allow` on 405, and `Connection: close` unless `keep_alive`.
pub(crate) fn response(status: u16, body: &[u8], keep_alive: bool) -> Vec<u8> {
    let mut out = response_head(status, body.len(), keep_alive);
    out.extend_from_slice(body);
    out
}

/// The head of a [`response`] whose body of `len` bytes is sent apart.
pub(crate) fn response_head(status: u16, len: usize, keep_alive: bool) -> Vec<u8> {
    typed_head(status, "application/json; charset=utf-8", len, keep_alive)
}

/// The head of a response of `content_type`, as [`response_head`].
pub(crate) fn typed_head(status: u16, content_type: &str, len: usize, keep_alive: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\n",
        reason(status),
    )
    .into_bytes();
    if status == 405 {
        out.extend_from_slice(b"Allow: GET, PUT, DELETE\r\n");
    }
    if status == 401 {
        out.extend_from_slice(b"WWW-Authenticate: Bearer\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

fn invalid(status: u16, reason: String, body: &str) -> Parse<Request> {
    Parse::Invalid {
        reason,
        reply: Some(response(status, body.as_bytes(), false)),
    }
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Parses the head at the front of `buf`; `Ok(None)` while incomplete.
fn parse_head(buf: &[u8], limits: Limits) -> Result<Option<(Head, usize)>, Parse<Request>> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(invalid(
                431,
                format!("request head over {MAX_HEAD} bytes"),
                "request head too large",
            ));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(invalid(
                431,
                format!("more than {MAX_HEADERS} header fields"),
                "too many header fields",
            ));
        }
        Err(e) => {
            return Err(invalid(
                400,
                format!("bad request head: {e}"),
                "bad request",
            ));
        }
    };
    if head_len > MAX_HEAD {
        return Err(invalid(
            431,
            format!("request head of {head_len} bytes"),
            "request head too large",
        ));
    }
    let http10 = req.version == Some(0);
    let mut keep_alive = !http10;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut expect_continue = false;
    let mut authorization: Option<Vec<u8>> = None;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok());
            match (n, length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(m)) if n == m => {}
                _ => {
                    return Err(invalid(
                        400,
                        "invalid or conflicting Content-Length".into(),
                        "bad request",
                    ));
                }
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let codings: Vec<&[u8]> = h
                .value
                .split(|b| *b == b',')
                .map(<[u8]>::trim_ascii)
                .collect();
            if codings.iter().all(|c| c.eq_ignore_ascii_case(b"chunked")) && codings.len() == 1 {
                chunked = true;
            } else {
                return Err(invalid(
                    501,
                    format!(
                        "transfer coding {:?} not supported",
                        String::from_utf8_lossy(h.value)
                    ),
                    "only the chunked transfer coding is supported",
                ));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            if has_token(h.value, "close") {
                keep_alive = false;
            }
        } else if name.eq_ignore_ascii_case("expect") && has_token(h.value, "100-continue") {
            expect_continue = true;
        } else if name.eq_ignore_ascii_case("authorization") {
            if authorization.is_some() {
                return Err(invalid(
                    400,
                    "more than one Authorization header".into(),
                    "bad request",
                ));
            }
            authorization = Some(h.value.to_vec());
        }
    }
    // HTTP/1.0 clients get one response per connection.
    if http10 {
        keep_alive = false;
    }
    let body = match (chunked, length) {
        (true, Some(_)) => {
            return Err(invalid(
                400,
                "both Transfer-Encoding and Content-Length".into(),
                "bad request",
            ));
        }
        (true, None) => Body::Chunked(Chunks {
            read: 0,
            written: 0,
            framing: head_len,
        }),
        (false, Some(n)) if n > limits.max_body => {
            return Err(invalid(
                413,
                format!("body of {n} bytes over the limit of {}", limits.max_body),
                "value too large",
            ));
        }
        (false, n) => Body::Length(n.unwrap_or(0)),
    };
    let head = Head {
        method: req.method.unwrap_or_default().to_owned(),
        target: req.path.unwrap_or_default().to_owned(),
        keep_alive,
        body,
        expect_continue,
        authorization,
    };
    Ok(Some((head, head_len)))
}

/// Decodes the chunks that have arrived, in place, and drops their
/// framing from the buffer; `Ok(Some(end))` once the last chunk and
/// trailers are in, with `end` the first byte after the request (the body
/// is then `buf[..c.written]`).
fn decode_chunks(
    buf: &mut Vec<u8>,
    c: &mut Chunks,
    limits: Limits,
) -> Result<Option<usize>, Parse<Request>> {
    let done = next_chunks(buf, c, limits)?;
    let pending = if done { 0 } else { buf.len() - c.read };
    let raw = c.framing.saturating_add(c.written).saturating_add(pending);
    if raw > limits.max_request {
        return Err(invalid(
            413,
            format!(
                "request of {raw} bytes or more as sent (with chunk framing) over the limit of {}",
                limits.max_request
            ),
            "request too large",
        ));
    }
    buf.drain(c.written..c.read);
    c.read = c.written;
    Ok(done.then_some(c.written))
}

/// Decodes the complete chunks at `c.read`; true once the last chunk and
/// its trailers are in.
fn next_chunks(buf: &mut [u8], c: &mut Chunks, limits: Limits) -> Result<bool, Parse<Request>> {
    loop {
        let line = &buf[c.read..];
        let (line_len, size) = match httparse::parse_chunk_size(line) {
            Ok(httparse::Status::Complete(c)) => c,
            Ok(httparse::Status::Partial) if line.len() > MAX_CHUNK_LINE => {
                return Err(invalid(
                    400,
                    "chunk-size line too long".into(),
                    "bad request",
                ));
            }
            Ok(httparse::Status::Partial) => return Ok(false),
            Err(_) => return Err(invalid(400, "bad chunk-size line".into(), "bad request")),
        };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size == 0 {
            // Optional trailer fields, then an empty line.
            let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let rest = &line[line_len..];
            return match httparse::parse_headers(rest, &mut fields) {
                Ok(httparse::Status::Complete((n, _))) => {
                    c.framing += line_len + n;
                    c.read += line_len + n;
                    Ok(true)
                }
                Ok(httparse::Status::Partial) if rest.len() > MAX_CHUNK_LINE => Err(invalid(
                    400,
                    "trailer section too long".into(),
                    "bad request",
                )),
                Ok(httparse::Status::Partial) => Ok(false),
                Err(_) => Err(invalid(400, "bad trailer section".into(), "bad request")),
            };
        }
        if size > limits.max_body.saturating_sub(c.written) {
            return Err(invalid(
                413,
                format!("chunked body over the limit of {}", limits.max_body),
                "value too large",
            ));
        }
        let data = c.read + line_len;
        let Some(end) = data.checked_add(size).and_then(|e| e.checked_add(2)) else {
            return Err(invalid(400, "chunk too large".into(), "bad request"));
        };
        if buf.len() < end {
            return Ok(false);
        }
        if &buf[end - 2..end] != b"\r\n" {
            return Err(invalid(400, "chunk without CRLF".into(), "bad request"));
        }
        buf.copy_within(data..data + size, c.written);
        c.written += size;
        c.framing += line_len + 2;
        c.read = end;
    }
}

/// Looks at the bytes received: a complete request is removed from the
/// front of `buf` (what follows it stays), with the head and any decoded
/// chunks removed as soon as they are parsed.
/// Decides once a request's head is parsed, before its body is read,
/// whether it may go on: from its method and its `Authorization` header's
/// value; `Err` says why not (for the log: it must not quote the header).
pub(crate) type Gate<'a> = &'a dyn Fn(&str, Option<&[u8]>) -> Result<(), String>;

/// Parses the request at the front of `buf`. A request refused by `gate`
/// is answered 401 (its body unread) and its connection closed.
pub(crate) fn parse(
    parser: &mut Parser,
    buf: &mut Vec<u8>,
    limits: Limits,
    gate: Gate<'_>,
) -> Parse<Request> {
    if parser.head.is_none() {
        match parse_head(buf, limits) {
            Ok(None) => {
                return Parse::More {
                    interim: None,
                    want: None,
                };
            }
            Ok(Some((mut head, len))) => {
                if let Err(reason) = gate(&head.method, head.authorization.take().as_deref()) {
                    return invalid(401, reason, "unauthorized");
                }
                buf.drain(..len);
                parser.head = Some(head);
            }
            Err(reply) => return reply,
        }
    }
    let Some(head) = &mut parser.head else {
        return Parse::More {
            interim: None,
            want: None,
        };
    };
    let end = match &mut head.body {
        Body::Length(n) => (buf.len() >= *n).then_some((*n, *n)),
        Body::Chunked(c) => match decode_chunks(buf, c, limits) {
            Ok(end) => end.map(|e| (c.written, e)),
            Err(reply) => return reply,
        },
    };
    let Some((body_len, consumed)) = end else {
        // Ask for the body once, if the client waits to be asked.
        let interim = std::mem::take(&mut head.expect_continue).then(|| CONTINUE.to_vec());
        let want = match head.body {
            Body::Length(n) => Some(n),
            Body::Chunked(_) => None,
        };
        return Parse::More { interim, want };
    };
    let rest = buf.split_off(consumed);
    let mut body = std::mem::replace(buf, rest);
    body.truncate(body_len);
    let Some(head) = parser.head.take() else {
        return Parse::More {
            interim: None,
            want: None,
        };
    };
    Parse::Done(Request {
        method: head.method,
        target: head.target,
        body,
        keep_alive: head.keep_alive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate that lets every request in.
    const OPEN: Gate<'static> = &|_, _| Ok(());

    const LIMITS: Limits = Limits::new(100);

    /// What feeding a request byte by byte gave: the requests (or the
    /// reason and error reply of a refusal), the interim replies, and the
    /// bytes left in the buffer.
    type Fed = (
        Vec<Result<Request, (String, Vec<u8>)>>,
        Vec<Vec<u8>>,
        Vec<u8>,
    );

    /// Feeds `bytes` one at a time.
    fn feed(bytes: &[u8]) -> Fed {
        let mut p = Parser::default();
        let mut buf = Vec::new();
        let mut out = Vec::new();
        let mut interims = Vec::new();
        for b in bytes {
            buf.push(*b);
            loop {
                match parse(&mut p, &mut buf, LIMITS, OPEN) {
                    Parse::More { interim, .. } => {
                        interims.extend(interim);
                        break;
                    }
                    Parse::Done(r) => out.push(Ok(r)),
                    Parse::Invalid { reason, reply } => {
                        out.push(Err((reason, reply.unwrap_or_default())));
                        return (out, interims, buf);
                    }
                }
            }
        }
        (out, interims, buf)
    }

    fn status_of(reply: &[u8]) -> u16 {
        String::from_utf8_lossy(reply)[9..12]
            .parse()
            .expect("status")
    }

    #[test]
    fn content_length_requests_one_byte_at_a_time_and_pipelined() {
        let (out, interims, rest) = feed(
            b"PUT /metadata?key=a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
              GET /metadata?key=a HTTP/1.1\r\nConnection: close\r\n\r\nDELETE",
        );
        assert!(interims.is_empty());
        assert_eq!(
            out,
            vec![
                Ok(Request {
                    method: "PUT".into(),
                    target: "/metadata?key=a".into(),
                    body: b"hello".to_vec(),
                    keep_alive: true,
                }),
                Ok(Request {
                    method: "GET".into(),
                    target: "/metadata?key=a".into(),
                    body: Vec::new(),
                    keep_alive: false,
                }),
            ]
        );
        assert_eq!(rest, b"DELETE");
    }

    #[test]
    fn chunked_body_is_decoded_in_place() {
        let (out, _, rest) = feed(
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
              5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\nNEXT",
        );
        assert_eq!(out.len(), 1);
        let r = out.into_iter().next().unwrap().expect("request");
        assert_eq!(r.body, b"hello world");
        assert_eq!(rest, b"NEXT");
        let (out, _, _) = feed(b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
        assert_eq!(out[0].as_ref().expect("request").body, b"");
    }

    #[test]
    fn expect_continue_is_answered_once_before_the_body() {
        let (out, interims, _) =
            feed(b"PUT /m HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc");
        assert_eq!(interims, vec![CONTINUE.to_vec()]);
        assert_eq!(out[0].as_ref().expect("request").body, b"abc");
    }

    #[test]
    fn http10_closes_after_the_response() {
        let (out, _, _) = feed(b"GET /m?key=a HTTP/1.0\r\n\r\n");
        assert!(!out[0].as_ref().expect("request").keep_alive);
    }

    #[test]
    fn oversized_bodies_are_refused_before_they_arrive() {
        let (out, _, _) = feed(b"PUT /m HTTP/1.1\r\nContent-Length: 101\r\n\r\n");
        let (_, reply) = out[0].as_ref().expect_err("refused");
        assert_eq!(status_of(reply), 413);
        let mut chunked = b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        chunked.extend_from_slice(b"64\r\n");
        chunked.extend_from_slice(&[b'x'; 100]);
        chunked.extend_from_slice(b"\r\n1\r\n");
        let (out, _, _) = feed(&chunked);
        let (_, reply) = out[0].as_ref().expect_err("refused");
        assert_eq!(status_of(reply), 413);
    }

    #[test]
    fn chunk_framing_counts_against_the_request_bound_and_is_dropped() {
        // Each byte of body in a chunk with 1000 bytes of extension: the
        // body stays within 100 bytes, the request does not stay within
        // its bound.
        let mut req = b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let chunk = format!("1;e={}\r\nx\r\n", "a".repeat(1000));
        let chunks = LIMITS.max_request / chunk.len() + 1;
        assert!(chunks < 100);
        for _ in 0..chunks {
            req.extend_from_slice(chunk.as_bytes());
        }
        let (out, _, _) = feed(&req);
        let (reason, reply) = out[0].as_ref().expect_err("refused");
        assert_eq!(status_of(reply), 413, "{reason}");
        // Below the bound, the buffer holds the decoded body and the chunk
        // in progress, not the framing of the chunks decoded.
        let mut p = Parser::default();
        let mut buf = b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..10 {
            buf.extend_from_slice(chunk.as_bytes());
        }
        buf.extend_from_slice(b"5;e=1\r\nhel");
        assert!(matches!(
            parse(&mut p, &mut buf, LIMITS, OPEN),
            Parse::More { .. }
        ));
        assert_eq!(buf, b"xxxxxxxxxx5;e=1\r\nhel");
        buf.extend_from_slice(b"lo\r\n0\r\n\r\n");
        let Parse::Done(r) = parse(&mut p, &mut buf, LIMITS, OPEN) else {
            panic!("not done");
        };
        assert_eq!(r.body, b"xxxxxxxxxxhello");
        assert!(buf.is_empty());
    }

    #[test]
    fn malformed_heads_are_refused() {
        for (bytes, status) in [
            (&b"\x16\x03\x01\x00 garbage\r\n\r\n"[..], 400),
            (
                b"PUT /m HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                400,
            ),
            (b"PUT /m HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400),
            (b"PUT /m HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
            (
                b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                400,
            ),
            (
                b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                400,
            ),
            (
                b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
                400,
            ),
        ] {
            let (out, _, _) = feed(bytes);
            let (reason, reply) = out
                .last()
                .and_then(|r| r.as_ref().err())
                .unwrap_or_else(|| panic!("{:?} accepted", String::from_utf8_lossy(bytes)));
            assert_eq!(status_of(reply), status, "{reason}");
        }
        let mut long = b"GET /m HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        let (out, _, _) = feed(&long);
        assert_eq!(status_of(&out[0].as_ref().expect_err("refused").1), 431);
    }

    #[test]
    fn responses() {
        let r = String::from_utf8(response(405, b"no", false)).unwrap();
        assert_eq!(
            r,
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json; charset=utf-8\r\n\
             Content-Length: 2\r\nAllow: GET, PUT, DELETE\r\nConnection: close\r\n\r\nno"
        );
        let r = String::from_utf8(response(200, b"{}", true)).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && !r.contains("Connection"));
    }
}
