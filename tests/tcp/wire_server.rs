//! Our TCP data server driven by a raw-socket client playing the Mooncake
//! initiator (spec §4.2–§4.4): every header and status word is written and
//! checked byte by byte here, not with the library's encoder.

use crate::common;

use common::*;
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;
use transfer_engine::Engine;

const MEM: usize = 1 << 20;
const HALF: usize = 64 << 10;
const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// An engine serving: `mem` (1 MiB, remote accessible), `adj` (two
/// adjacent 64 KiB registrations), `private` (registered, not remote
/// accessible) and `unreg` (never registered).
struct Target {
    e: std::sync::Arc<Engine>,
    port: u16,
    mem: Buf,
    adj: Buf,
    private: Buf,
    unreg: Buf,
}

impl Target {
    fn new() -> Target {
        let e = engine();
        let mem = Buf::new(MEM, 11);
        let adj = Buf::new(2 * HALF, 22);
        let private = Buf::new(HALF, 33);
        let unreg = Buf::new(HALF, 44);
        register(&e, &mem, true);
        register_range(&e, adj.addr(), HALF as u64, true);
        register_range(&e, adj.addr() + HALF as u64, HALF as u64, true);
        register(&e, &private, false);
        let port = data_port(&e);
        Target {
            e,
            port,
            mem,
            adj,
            private,
            unreg,
        }
    }

    fn snapshot(&self) -> [Vec<u8>; 4] {
        [
            self.mem.snapshot(),
            self.adj.snapshot(),
            self.private.snapshot(),
            self.unreg.snapshot(),
        ]
    }

    /// A fresh connection: v2 WRITE then v2 READ of the last 4 KiB of
    /// `mem`, byte-verified; the rest of the memory is unchanged.
    fn fresh_request_works(&self, seed: u8) {
        let before = self.snapshot();
        let off = MEM - 4096;
        let data = pattern(4096, seed);
        let mut c = connect(self.port);
        let mut req = raw_header(4096, self.mem.addr() + off as u64, 0x81).to_vec();
        req.extend_from_slice(&data);
        req.extend_from_slice(&raw_header(4096, self.mem.addr() + off as u64, 0x80));
        c.write_all(&req).unwrap();
        let mut expect = status_bytes(OK_WORD).to_vec();
        expect.extend_from_slice(&status_bytes(OK_WORD));
        expect.extend_from_slice(&data);
        assert_eq!(read_n(&mut c, expect.len()), expect);
        assert_eq!(self.mem.get(off, 4096), data);
        let after = self.snapshot();
        assert_eq!(after[0][..off], before[0][..off]);
        assert_eq!(after[1..], before[1..]);
    }
}

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut out = vec![0u8; n];
    s.read_exact(&mut out).expect("reply bytes");
    out
}

#[test]
fn status_words_are_spelled_as_in_the_spec() {
    // Little-endian "\0\0\0\0VTCM": the magic is the high 32 bits.
    assert_eq!(status_bytes(OK_WORD), [0, 0, 0, 0, b'V', b'T', b'C', b'M']);
    assert_eq!(
        status_bytes(REJECTED_WORD),
        [1, 0, 0, 0, b'V', b'T', b'C', b'M']
    );
    let h = raw_header(0x0102_0304, 0x7f00_1122_3344, 0x81);
    assert_eq!(h.len(), 24);
    assert_eq!(&h[..8], &[4, 3, 2, 1, 0, 0, 0, 0]);
    assert_eq!(&h[8..16], &[0x44, 0x33, 0x22, 0x11, 0x00, 0x7f, 0, 0]);
    assert_eq!(h[16], 0x81);
}

#[test]
fn v2_write_then_read_on_one_connection() {
    let t = Target::new();
    let before = t.mem.snapshot();
    let mut c = connect(t.port);
    // Small unaligned WRITE.
    let off = 4097usize;
    let data = pattern(100_000, 3);
    let mut req = raw_header(data.len() as u64, t.mem.addr() + off as u64, 0x81).to_vec();
    req.extend_from_slice(&data);
    c.write_all(&req).unwrap();
    assert_eq!(read_n(&mut c, 8), status_bytes(OK_WORD), "WRITE ack");
    // The ack comes after the last byte is stored.
    let mut expect = before.clone();
    expect[off..off + data.len()].copy_from_slice(&data);
    assert_eq!(t.mem.snapshot(), expect);
    // READ back: OK, then exactly the bytes.
    c.write_all(&raw_header(
        data.len() as u64,
        t.mem.addr() + off as u64,
        0x80,
    ))
    .unwrap();
    assert_eq!(read_n(&mut c, 8), status_bytes(OK_WORD), "READ status");
    assert_eq!(read_n(&mut c, data.len()), data);
    // The whole buffer in one WRITE (many server-side reads) and one READ.
    let whole = pattern(MEM, 99);
    let mut req = raw_header(MEM as u64, t.mem.addr(), 0x81).to_vec();
    req.extend_from_slice(&whole);
    req.extend_from_slice(&raw_header(MEM as u64, t.mem.addr(), 0x80));
    c.write_all(&req).unwrap();
    assert_eq!(read_n(&mut c, 8), status_bytes(OK_WORD));
    assert_eq!(read_n(&mut c, 8), status_bytes(OK_WORD));
    assert!(read_n(&mut c, MEM) == whole, "READ of the whole buffer");
    assert!(t.mem.snapshot() == whole);
    // The last byte of a buffer and a 1-byte request.
    c.write_all(&raw_header(1, t.mem.addr() + MEM as u64 - 1, 0x80))
        .unwrap();
    assert_eq!(read_n(&mut c, 9)[8], whole[MEM - 1]);
    drop(c);
    t.fresh_request_works(5);
    t.e.shutdown();
}

#[test]
fn header_arriving_byte_by_byte_is_assembled() {
    let t = Target::new();
    let mut c = connect(t.port);
    let data = pattern(777, 8);
    let mut req = raw_header(777, t.mem.addr() + 123, 0x81).to_vec();
    req.extend_from_slice(&data);
    for b in &req[..40] {
        c.write_all(std::slice::from_ref(b)).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    c.write_all(&req[40..]).unwrap();
    assert_eq!(read_n(&mut c, 8), status_bytes(OK_WORD));
    assert_eq!(t.mem.get(123, 777), data);
    t.e.shutdown();
}

/// v1 requests pipelined: several sent before anything is read. A v1 WRITE
/// is answered by nothing, a v1 READ by just the bytes, in order. A final
/// v2 READ is a sentinel: any stray byte before it would shift it.
#[test]
fn v1_pipelined_write_and_read() {
    let t = Target::new();
    let initial = t.mem.snapshot();
    let base = t.mem.addr();
    let d1 = pattern(5000, 1);
    let d2 = pattern(5000, 2);
    let mut req = Vec::new();
    req.extend_from_slice(&raw_header(5000, base, 1));
    req.extend_from_slice(&d1);
    req.extend_from_slice(&raw_header(5000, base, 0));
    req.extend_from_slice(&raw_header(5000, base + 2500, 1));
    req.extend_from_slice(&d2);
    req.extend_from_slice(&raw_header(7500, base, 0));
    req.extend_from_slice(&raw_header(70_000, base + 100_000, 0));
    req.extend_from_slice(&raw_header(16, base + 500_000, 0x80));
    let mut c = connect(t.port);
    c.write_all(&req).unwrap();

    let mut expect = d1.clone();
    expect.extend_from_slice(&d1[..2500]);
    expect.extend_from_slice(&d2);
    expect.extend_from_slice(&initial[100_000..170_000]);
    expect.extend_from_slice(&status_bytes(OK_WORD));
    expect.extend_from_slice(&initial[500_000..500_016]);
    let got = read_n(&mut c, expect.len());
    assert!(got == expect, "pipelined v1 answers differ");
    let mut mem = initial;
    mem[..2500].copy_from_slice(&d1[..2500]);
    mem[2500..7500].copy_from_slice(&d2);
    assert!(t.mem.snapshot() == mem);
    t.e.shutdown();
}

/// v2 requests pipelined: every WRITE is acknowledged, every READ answered
/// with OK then the bytes, in request order.
#[test]
fn v2_pipelined_acks_in_order() {
    let t = Target::new();
    let base = t.mem.addr();
    let initial = t.mem.snapshot();
    let mut req = Vec::new();
    let mut expect = Vec::new();
    let mut mem = initial.clone();
    for i in 0..20usize {
        let off = i * 30_000;
        let len = 1000 + i * 997;
        let d = pattern(len, i as u8);
        req.extend_from_slice(&raw_header(len as u64, base + off as u64, 0x81));
        req.extend_from_slice(&d);
        mem[off..off + len].copy_from_slice(&d);
        expect.extend_from_slice(&status_bytes(OK_WORD));
        if i % 3 == 0 {
            req.extend_from_slice(&raw_header(len as u64 + 7, base + off as u64, 0x80));
            expect.extend_from_slice(&status_bytes(OK_WORD));
            expect.extend_from_slice(&mem[off..off + len + 7]);
        }
    }
    let mut c = connect(t.port);
    c.write_all(&req).unwrap();
    let got = read_n(&mut c, expect.len());
    assert!(got == expect, "pipelined v2 answers differ");
    assert!(t.mem.snapshot() == mem);
    t.e.shutdown();
}

/// Sends one request that must be rejected and checks the answer: v2 →
/// exactly the ADDR_REJECTED word, then the connection is closed; v1 →
/// closed with no data. Memory is unchanged and a fresh connection works.
fn expect_rejected(t: &Target, what: &str, size: u64, addr: u64, opcode: u8, seed: u8) {
    let before = t.snapshot();
    let mut c = connect(t.port);
    let mut req = raw_header(size, addr, opcode).to_vec();
    if opcode & 0x7f == 1 {
        // A real initiator streams the payload right behind the header.
        req.extend(std::iter::repeat_n(0xEEu8, size.min(4096) as usize));
    }
    // The server may close before reading the payload: a failed send is fine.
    let _ = c.write_all(&req);
    let got = read_until_closed(&mut c, CLOSE_WITHIN);
    if opcode & 0x80 != 0 {
        assert_eq!(
            got,
            status_bytes(REJECTED_WORD),
            "{what} (opcode {opcode:#x}): expected ADDR_REJECTED then close"
        );
    } else {
        assert!(
            got.is_empty(),
            "{what} (opcode {opcode:#x}): v1 rejection must close without data, got {} bytes",
            got.len()
        );
    }
    assert!(
        t.snapshot() == before,
        "{what} (opcode {opcode:#x}): memory changed"
    );
    t.fresh_request_works(seed);
}

#[test]
fn rejected_requests_close_only_their_connection() {
    let t = Target::new();
    let m = t.mem.addr();
    let cases: [(&str, u64, u64); 7] = [
        ("unregistered address", 64, t.unreg.addr()),
        ("past the end of a buffer", 20, m + MEM as u64 - 10),
        ("just past the end", 1, m + MEM as u64),
        (
            "spanning two adjacent buffers",
            64,
            t.adj.addr() + HALF as u64 - 32,
        ),
        ("size 0", 0, m + 10),
        ("addr + size overflows", 16, u64::MAX - 4),
        ("not remote accessible", 64, t.private.addr()),
    ];
    let mut seed = 0u8;
    for (what, size, addr) in cases {
        for opcode in [0x81, 0x80, 0x01, 0x00] {
            seed = seed.wrapping_add(1);
            expect_rejected(&t, what, size, addr, opcode, seed);
        }
    }
    // Each adjacent half on its own is fine.
    let mut c = connect(t.port);
    c.write_all(&raw_header(32, t.adj.addr() + HALF as u64 - 32, 0x80))
        .unwrap();
    c.write_all(&raw_header(32, t.adj.addr() + HALF as u64, 0x80))
        .unwrap();
    let got = read_n(&mut c, 80);
    assert_eq!(got[..8], status_bytes(OK_WORD));
    assert_eq!(got[8..40], t.adj.get(HALF - 32, 32));
    assert_eq!(got[40..48], status_bytes(OK_WORD));
    assert_eq!(got[48..], t.adj.get(HALF, 32));
    t.e.shutdown();
}

#[test]
fn garbage_and_truncated_headers_close_only_their_connection() {
    let t = Target::new();
    let mut rng = Rng::new(0x5eed);
    for round in 0..16u8 {
        let before = t.snapshot();
        let garbage = rng.bytes(24);
        let mut c = connect(t.port);
        c.write_all(&garbage).unwrap();
        let got = read_until_closed(&mut c, CLOSE_WITHIN);
        if garbage[16] & 0x80 != 0 {
            assert_eq!(got, status_bytes(REJECTED_WORD), "garbage {garbage:02x?}");
        } else {
            assert!(got.is_empty(), "garbage {garbage:02x?} got {got:02x?}");
        }
        assert!(t.snapshot() == before);
        t.fresh_request_works(round);
    }
    // A truncated header, then the client goes away.
    for cut in [1usize, 8, 16, 17, 23] {
        let before = t.snapshot();
        let h = raw_header(64, t.mem.addr(), 0x81);
        let mut c = connect(t.port);
        c.write_all(&h[..cut]).unwrap();
        drop(c);
        assert!(t.snapshot() == before);
        t.fresh_request_works(cut as u8);
    }
    // A header whose WRITE payload is cut short, then the client goes away.
    // The 100 bytes sent equal what is there already: whether the server
    // stores them or not (its session ends on its own time), nothing else
    // may change.
    let before = t.snapshot();
    let mut c = connect(t.port);
    let mut req = raw_header(10_000, t.mem.addr(), 0x81).to_vec();
    req.extend_from_slice(&before[0][..100]);
    c.write_all(&req).unwrap();
    drop(c);
    t.fresh_request_works(77);
    assert_eq!(t.mem.get(0, MEM - 4096), before[0][..MEM - 4096]);
    t.e.shutdown();
}

/// Large v2 WRITEs (received straight into memory, each with the next
/// header behind it in the same receive) pipelined and sent in pieces of
/// odd sizes with pauses, so that a receive ends inside a payload, at its
/// end, and inside the next header; then one cut short by the client
/// going away. Every acknowledged byte lands where its header said, and
/// nothing else changes.
#[test]
fn large_writes_arriving_in_odd_pieces_land_exactly() {
    let t = Target::new();
    let base = t.mem.addr();
    let mut mem = t.mem.snapshot();
    let mut req = Vec::new();
    let mut expect = Vec::new();
    for i in 0..4usize {
        let (off, len) = (i * 200_000 + 13, 100_000 + i * 4099);
        let d = pattern(len, 90 + i as u8);
        req.extend_from_slice(&raw_header(len as u64, base + off as u64, 0x81));
        req.extend_from_slice(&d);
        mem[off..off + len].copy_from_slice(&d);
        expect.extend_from_slice(&status_bytes(OK_WORD));
    }
    req.extend_from_slice(&raw_header(64, base + 13, 0x80));
    expect.extend_from_slice(&status_bytes(OK_WORD));
    expect.extend_from_slice(&mem[13..77]);
    let mut c = connect(t.port);
    let mut rng = Rng::new(0x1a7e);
    let mut at = 0;
    for (n, piece) in [7usize, 17, 1000, 33_333, 24, 65_536, 5]
        .iter()
        .cycle()
        .enumerate()
    {
        if at == req.len() {
            break;
        }
        let end = (at + piece + rng.bytes(1)[0] as usize).min(req.len());
        c.write_all(&req[at..end]).unwrap();
        at = end;
        if n % 3 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert!(read_n(&mut c, expect.len()) == expect, "answers differ");
    assert!(t.mem.snapshot() == mem, "memory differs");
    // Cut short: the bytes sent equal what is there, so whether the
    // server stored them or not, nothing may change.
    let mut c = connect(t.port);
    let mut req = raw_header(200_000, base, 0x81).to_vec();
    req.extend_from_slice(&mem[..50_000]);
    c.write_all(&req).unwrap();
    drop(c);
    t.fresh_request_works(78);
    assert_eq!(t.mem.get(0, MEM - 4096), mem[..MEM - 4096]);
    t.e.shutdown();
}

#[test]
fn rejection_does_not_disturb_other_sessions() {
    let t = Target::new();
    let base = t.mem.addr();
    let mut healthy = connect(t.port);
    let d = pattern(3000, 9);
    let mut req = raw_header(3000, base + 50, 0x81).to_vec();
    req.extend_from_slice(&d);
    healthy.write_all(&req).unwrap();
    assert_eq!(read_n(&mut healthy, 8), status_bytes(OK_WORD));

    for opcode in [0x81u8, 0x00] {
        let mut bad = connect(t.port);
        let mut req = raw_header(64, t.unreg.addr(), opcode).to_vec();
        if opcode & 0x7f == 1 {
            req.extend_from_slice(&[0xEE; 64]);
        }
        let _ = bad.write_all(&req);
        let got = read_until_closed(&mut bad, CLOSE_WITHIN);
        assert_eq!(got.len(), if opcode & 0x80 != 0 { 8 } else { 0 });
    }

    // The healthy connection still works, in both framings.
    healthy
        .write_all(&raw_header(3000, base + 50, 0x80))
        .unwrap();
    assert_eq!(read_n(&mut healthy, 8), status_bytes(OK_WORD));
    assert_eq!(read_n(&mut healthy, 3000), d);
    healthy.write_all(&raw_header(3000, base + 50, 0)).unwrap();
    assert_eq!(read_n(&mut healthy, 3000), d);
    let d2 = pattern(3000, 10);
    let mut req = raw_header(3000, base + 50, 0x81).to_vec();
    req.extend_from_slice(&d2);
    healthy.write_all(&req).unwrap();
    assert_eq!(read_n(&mut healthy, 8), status_bytes(OK_WORD));
    assert_eq!(t.mem.get(50, 3000), d2);
    t.e.shutdown();
}

/// Mooncake's server treats every opcode other than WRITE (1) as READ; the
/// 0x80 bit selects the framing.
#[test]
fn other_opcodes_are_served_as_read() {
    let t = Target::new();
    let base = t.mem.addr();
    let before = t.mem.snapshot();
    let mut req = Vec::new();
    let mut expect = Vec::new();
    for (i, op) in [2u8, 0x7f, 0x03, 0x40, 0x82, 0xff, 0xc0, 0x80, 0x00]
        .into_iter()
        .enumerate()
    {
        let off = 1000 + i * 4000;
        req.extend_from_slice(&raw_header(1234, base + off as u64, op));
        if op & 0x80 != 0 {
            expect.extend_from_slice(&status_bytes(OK_WORD));
        }
        expect.extend_from_slice(&before[off..off + 1234]);
    }
    let mut c = connect(t.port);
    c.write_all(&req).unwrap();
    assert!(read_n(&mut c, expect.len()) == expect);
    assert!(t.mem.snapshot() == before, "a READ changed memory");
    t.e.shutdown();
}

/// After the client half-closes, the server ends the session and closes
/// its side too (Mooncake's asio session is destroyed at EOF). A session
/// that ends on a truncated header must also close its socket.
#[test]
fn server_closes_its_side_when_the_client_is_done() {
    let t = Target::new();
    let mut c = connect(t.port);
    c.write_all(&raw_header(8, t.mem.addr(), 0x80)).unwrap();
    assert_eq!(read_n(&mut c, 16)[..8], status_bytes(OK_WORD));
    c.shutdown(Shutdown::Write).unwrap();
    assert!(read_until_closed(&mut c, CLOSE_WITHIN).is_empty());

    let mut c = connect(t.port);
    c.write_all(&raw_header(8, t.mem.addr(), 0x80)[..10])
        .unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert!(read_until_closed(&mut c, CLOSE_WITHIN).is_empty());
    t.e.shutdown();
}
