//! Once `unregister` (or the engine's shutdown) returns, no peer request
//! reads or writes any byte of the range: a raw-socket peer that starts a
//! request, waits for the owner to unregister the buffer (and map new
//! memory at the same address), then sends the rest, must neither write the
//! new memory nor read what was written after the unregister. The request
//! that straddles the moment fails: its connection is cut off.

use crate::common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// Writes `data` in the background (the server may reset the connection
/// or stop reading); returns whether every byte was taken.
fn write_in_background(mut s: TcpStream, data: Vec<u8>) -> std::thread::JoinHandle<bool> {
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    std::thread::spawn(move || s.write_all(&data).is_ok())
}

#[test]
fn write_straddling_unregister_does_not_touch_new_memory() {
    let e = engine();
    let m = Mapping::filled(4 * MIB, 0x11);
    register_range(&e, m.addr(), m.len as u64, true);
    let mut c = connect(data_port(&e));
    // A v2 WRITE of the whole buffer: header and one byte, then a pause.
    let mut first = raw_header(m.len as u64, m.addr(), 0x81).to_vec();
    first.push(0xEE);
    c.write_all(&first).unwrap();
    wait_for(
        "the first payload byte to land",
        Duration::from_secs(10),
        || {
            // SAFETY: byte 0 of our mapping.
            unsafe { *m.addr == 0xEE }
        },
    );
    e.unregister(&[m.addr()]).expect("unregister");
    m.remap(0x22);
    // The rest of the payload now targets the new memory.
    let rest = write_in_background(c.try_clone().unwrap(), vec![0xEE; m.len - 1]);
    let got = read_until_closed(&mut c, Duration::from_secs(20));
    let _ = rest.join();
    assert!(
        got.is_empty(),
        "the server answered {got:?} to a request cut off by unregister"
    );
    assert!(
        m.all(0x22),
        "bytes landed in memory mapped after unregister"
    );
    e.shutdown();
}

#[test]
fn slow_read_is_cut_off_at_unregister() {
    let e = engine();
    let len = 64 * MIB;
    let m = Mapping::filled(len, 0x33);
    register_range(&e, m.addr(), len as u64, true);
    let mut c = connect(data_port(&e));
    c.write_all(&raw_header(len as u64, m.addr(), 0x80))
        .unwrap();
    // Take the status word and the first MiB, then stop reading: the
    // server blocks with most of the READ unsent.
    let mut head = vec![0u8; 8 + MIB];
    c.read_exact(&mut head).unwrap();
    assert_eq!(head[..8], status_bytes(OK_WORD));
    assert!(head[8..].iter().all(|&b| b == 0x33));
    std::thread::sleep(Duration::from_millis(300));
    e.unregister(&[m.addr()]).expect("unregister");
    // Written after the unregister: must never reach the peer.
    m.fill(0x44);
    let rest = read_until_closed(&mut c, Duration::from_secs(20));
    assert!(
        rest.iter().all(|&b| b == 0x33),
        "the READ returned bytes written after unregister"
    );
    assert!(
        rest.len() < len - MIB,
        "the READ was not cut off ({} of {} bytes arrived)",
        rest.len(),
        len - MIB
    );
    e.shutdown();
}

#[test]
fn trickling_write_cannot_outlive_unregister() {
    let e = engine();
    let m = Mapping::filled(MIB, 0x55);
    register_range(&e, m.addr(), m.len as u64, true);
    let mut c = connect(data_port(&e));
    c.write_all(&raw_header(m.len as u64, m.addr(), 0x01))
        .unwrap();
    // One byte at a time: the request stays in progress.
    for i in 0..5 {
        c.write_all(&[0xE0 + i]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    e.unregister(&[m.addr()]).expect("unregister");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "unregister waited {:?}",
        t.elapsed()
    );
    m.fill(0x66);
    for _ in 0..20 {
        if c.write_all(&[0xEF]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(m.all(0x66), "a trickled byte landed after unregister");
    e.shutdown();
}

#[test]
fn shutdown_fences_every_buffer() {
    let e = engine();
    let m = Mapping::filled(4 * MIB, 0x77);
    register_range(&e, m.addr(), m.len as u64, true);
    let c = connect(data_port(&e));
    let mut first = raw_header(m.len as u64, m.addr(), 0x81).to_vec();
    first.extend_from_slice(&[0xEE; 4096]);
    (&c).write_all(&first).unwrap();
    wait_for(
        "the first payload bytes to land",
        Duration::from_secs(10),
        || {
            // SAFETY: within our mapping.
            unsafe { *m.addr.add(4095) == 0xEE }
        },
    );
    e.shutdown();
    m.fill(0x78);
    let rest = write_in_background(c, vec![0xEE; m.len - 4096]);
    let _ = rest.join();
    std::thread::sleep(Duration::from_millis(200));
    assert!(m.all(0x78), "bytes landed after the engine was shut down");
}
