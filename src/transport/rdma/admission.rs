//! Who may set up an endpoint with us: the check of a Connection frame
//! (the passive side of the handshake) against what the peer it names
//! publishes.
//!
//! A frame names its sender by NIC path, `<server>@<device>`. It is taken
//! only when it comes from that server's published host — the host of its
//! handshake listener (the name's host in P2P mode, its `rpc_meta` entry
//! with a store) or an IP address in one of the RoCE GIDs it publishes —
//! and carries the GID the server publishes for that device. So a frame
//! from elsewhere can neither replace the endpoint of a peer whose path it
//! claims nor make us create endpoints for made-up paths.
//!
//! What a server publishes is looked up through the engine (its cached
//! descriptor, else a fetch) and kept: a verified server until a frame
//! fails the check (then it is looked up afresh: at once the first time,
//! as the server may have just changed its GID, then at most every
//! [`REVERIFY_AFTER`]), a server that cannot be looked up for
//! [`UNKNOWN_FOR`]. Both tables are bounded. Lookups of servers not known
//! yet are bounded too: `MC_RDMA_PEER_LOOKUPS_PER_SEC`, at most
//! [`AdmissionLimits::concurrent`] at once (the other handshake workers
//! keep serving), and a source whose frames made a lookup fail or take
//! long gets one frame checked at a time. A frame that finds no room is
//! refused, and its sender tries again.

use crate::rpc::ClientOptions;
use crate::sync;
use crate::verbs::{Gid, parse_gid};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv6Addr, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a server that could not be looked up is refused without
/// another lookup.
pub const UNKNOWN_FOR: Duration = Duration::from_secs(5);

/// Shortest interval between two fresh lookups of a verified server whose
/// frames fail the check (it may have moved, or changed its GID).
pub const REVERIFY_AFTER: Duration = Duration::from_secs(2);

/// What a peer publishes, as the engine looks it up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerRecord {
    /// Host of its handshake listener: an address or a DNS name.
    pub rpc_host: String,
    /// Its devices: name, and GID in Mooncake's text form.
    pub devices: Vec<(String, String)>,
}

/// Looks up what the peer named `server` publishes; `fresh`: not from a
/// cache. A fetch over the handshake RPC uses the given options (their
/// timeouts bound the lookup).
pub type PeerLookup =
    Box<dyn Fn(&str, bool, &ClientOptions) -> Result<PeerRecord, String> + Send + Sync>;

/// Bound on connecting to a peer's handshake listener for a lookup: the
/// peer just connected to us, so its listener is up.
pub const LOOKUP_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Bounds of the lookups.
#[derive(Debug, Clone)]
pub struct AdmissionLimits {
    /// Lookups of servers not known yet, per second (and in a burst)
    /// (`MC_RDMA_PEER_LOOKUPS_PER_SEC`).
    pub per_sec: u32,
    /// Lookups at once: half the handshake listener's workers
    /// (`MC_HANDSHAKE_WORKERS`), at least one, so that the others keep
    /// serving while lookups wait on the network.
    pub concurrent: usize,
    /// Entries kept in each table: verified servers, unknown servers,
    /// suspect sources (at least 1024, at least `MC_RDMA_MAX_PASSIVE_EP`).
    pub capacity: usize,
    /// Longest wait of a frame for the lookup of its server by another
    /// frame.
    pub wait: Duration,
    /// The options of a lookup's fetch: connect within
    /// [`LOOKUP_CONNECT_TIMEOUT`] (or `MC_HANDSHAKE_CONNECT_TIMEOUT` if
    /// shorter), reply within `MC_HANDSHAKE_IO_TIMEOUT`.
    pub rpc: ClientOptions,
}

/// What a Connection frame claims: the server and device it names, the
/// GID it carries (if any), and the address it came from.
#[derive(Clone, Copy)]
struct Claim<'a> {
    server: &'a str,
    device: &'a str,
    gid: Option<&'a Gid>,
    from: IpAddr,
}

/// A verified server: the addresses its frames may come from, and the
/// GIDs of its devices.
#[derive(Debug)]
struct Identity {
    addrs: Vec<IpAddr>,
    gids: HashMap<String, Gid>,
}

/// The IP address a RoCE GID carries, if it is one: IPv4-mapped (RoCE v2
/// over IPv4) or a routable IPv6 address. Link-local GIDs (RoCE v1,
/// InfiniBand) carry none.
fn gid_address(gid: &Gid) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(*gid);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return (!v4.is_unspecified()).then_some(IpAddr::V4(v4));
    }
    let link_local = (v6.segments()[0] & 0xffc0) == 0xfe80;
    (!link_local && !v6.is_unspecified() && !v6.is_multicast()).then_some(IpAddr::V6(v6))
}

impl Identity {
    /// Resolves what `r` publishes (a DNS name through the resolver).
    fn resolve(r: &PeerRecord) -> Identity {
        let host = r.rpc_host.trim_start_matches('[').trim_end_matches(']');
        let mut addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => (host, 0)
                .to_socket_addrs()
                .map(|it| it.map(|a| a.ip()).collect())
                .unwrap_or_default(),
        };
        let mut gids = HashMap::new();
        for (name, text) in &r.devices {
            if let Some(g) = parse_gid(text) {
                addrs.extend(gid_address(&g));
                gids.insert(name.clone(), g);
            }
        }
        for a in &mut addrs {
            *a = a.to_canonical();
        }
        addrs.sort_unstable();
        addrs.dedup();
        Identity { addrs, gids }
    }

    /// Whether a frame that makes `claim` is the server's; else why not.
    fn admits(&self, claim: Claim<'_>) -> Result<(), String> {
        let Claim {
            server,
            device,
            gid,
            from,
        } = claim;
        if !self.addrs.contains(&from) {
            return Err(format!(
                "handshake for {server}@{device} came from {from}, which is not a host {server} \
                 publishes ({:?})",
                self.addrs
            ));
        }
        match (self.gids.get(device), gid) {
            (None, _) => Err(format!("{server} publishes no device {device}")),
            (Some(published), Some(g)) if published != g => Err(format!(
                "handshake for {server}@{device} carries GID {}, not the one {server} publishes \
                 for it ({})",
                crate::verbs::gid_to_string(g),
                crate::verbs::gid_to_string(published)
            )),
            _ => Ok(()),
        }
    }
}

/// A bounded table of servers, oldest entry evicted first.
struct Recent<V> {
    entries: HashMap<String, (u64, Instant, V)>,
    order: BTreeMap<u64, String>,
    next: u64,
    capacity: usize,
}

impl<V> Recent<V> {
    fn new(capacity: usize) -> Self {
        Recent {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            capacity: capacity.max(1),
        }
    }

    fn get(&self, server: &str) -> Option<(Instant, &V)> {
        self.entries.get(server).map(|(_, at, v)| (*at, v))
    }

    fn remove(&mut self, server: &str) {
        if let Some((key, _, _)) = self.entries.remove(server) {
            self.order.remove(&key);
        }
    }

    fn put(&mut self, server: &str, v: V) {
        self.remove(server);
        while self.entries.len() >= self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        let key = self.next;
        self.next += 1;
        self.entries
            .insert(server.to_string(), (key, Instant::now(), v));
        self.order.insert(key, server.to_string());
    }
}

/// The state behind [`Admission`]'s lock.
struct Book {
    /// Verified servers, each with whether its lookup was a fresh one
    /// made because a frame failed the check.
    verified: Recent<(Arc<Identity>, bool)>,
    unknown: Recent<String>,
    /// Source addresses whose frames caused a lookup that failed or was
    /// slow, recently.
    suspects: Recent<()>,
    /// Servers being looked up.
    in_flight: HashSet<String>,
    /// Frames in the check (looking up, or waiting), by source.
    held: HashMap<IpAddr, usize>,
    tokens: f64,
    refilled: Instant,
}

impl Book {
    /// Takes one lookup token, refilling at `per_sec`.
    fn take_token(&mut self, per_sec: u32) -> bool {
        let rate = f64::from(per_sec.max(1));
        let now = Instant::now();
        let dt = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + dt * rate).min(rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn suspect(&self, from: IpAddr) -> bool {
        self.suspects
            .get(&from.to_string())
            .is_some_and(|(at, _)| at.elapsed() < SUSPECT_FOR)
    }
}

/// How long a source whose frames caused a failed or slow lookup may have
/// only one frame in the check at a time.
const SUSPECT_FOR: Duration = Duration::from_secs(10);

/// A lookup slower than this makes its source a suspect.
const SLOW_LOOKUP: Duration = Duration::from_secs(2);

/// Longest wait of a frame for a free lookup slot (lookups of peers that
/// answer take milliseconds).
const SLOT_WAIT: Duration = Duration::from_secs(1);

/// The passive handshake's check, shared by the transport's devices.
pub struct Admission {
    lookup: RwLock<Option<PeerLookup>>,
    book: Mutex<Book>,
    done: Condvar,
    limits: AdmissionLimits,
}

impl Admission {
    /// A check with no lookup yet (every frame is refused until
    /// [`Admission::set_lookup`]).
    pub fn new(limits: AdmissionLimits) -> Admission {
        Admission {
            lookup: RwLock::new(None),
            book: Mutex::new(Book {
                verified: Recent::new(limits.capacity),
                unknown: Recent::new(limits.capacity),
                suspects: Recent::new(limits.capacity),
                in_flight: HashSet::new(),
                held: HashMap::new(),
                tokens: f64::from(limits.per_sec.max(1)),
                refilled: Instant::now(),
            }),
            done: Condvar::new(),
            limits,
        }
    }

    /// Looks peers up with `lookup` from now on.
    pub fn set_lookup(&self, lookup: PeerLookup) {
        *sync::write(&self.lookup) = Some(lookup);
    }

    /// Whether a Connection frame from `from` that names `server`'s device
    /// `device` with `gid` (if it carries one) may set up an endpoint;
    /// else why not.
    ///
    /// A server not known yet is looked up, by at most
    /// [`AdmissionLimits::concurrent`] frames at once; a frame waits for
    /// the lookup of its server by another frame (at most
    /// [`AdmissionLimits::wait`]) or for a free slot (at most a second).
    /// A source whose frames caused a failed or slow lookup recently has
    /// at most one frame in here at a time; its others are refused at once.
    pub fn check(
        &self,
        server: &str,
        device: &str,
        gid: Option<&Gid>,
        from: IpAddr,
    ) -> Result<(), String> {
        let from = from.to_canonical();
        let start = Instant::now();
        let mut looked_up = false;
        let mut holding = false;
        let mut book = sync::lock(&self.book);
        let verdict = loop {
            let mut fresh = false;
            if let Some((at, (id, rechecked))) = book.verified.get(server) {
                let claim = Claim {
                    server,
                    device,
                    gid,
                    from,
                };
                match id.admits(claim) {
                    Ok(()) => break Ok(()),
                    Err(why) if looked_up || (*rechecked && at.elapsed() < REVERIFY_AFTER) => {
                        break Err(why);
                    }
                    Err(_) => fresh = true,
                }
            } else if let Some((at, why)) = book.unknown.get(server) {
                if looked_up || at.elapsed() < UNKNOWN_FOR {
                    break Err(why.clone());
                }
            }
            if !holding {
                if book.suspect(from) && book.held.get(&from).is_some_and(|n| *n > 0) {
                    break Err(format!(
                        "{server} is not verified yet and a frame from {from} is being checked; \
                         try again"
                    ));
                }
                *book.held.entry(from).or_default() += 1;
                holding = true;
            }
            let running = book.in_flight.contains(server);
            if running || book.in_flight.len() >= self.limits.concurrent {
                let limit = if running { self.limits.wait } else { SLOT_WAIT };
                let left = limit.saturating_sub(start.elapsed());
                if left.is_zero() {
                    break Err(format!(
                        "{server} is not verified yet and the lookups are busy; try again"
                    ));
                }
                book = self
                    .done
                    .wait_timeout(book, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            if !book.take_token(self.limits.per_sec) {
                break Err(format!(
                    "{server} is not verified yet and lookups are at their rate \
                     (MC_RDMA_PEER_LOOKUPS_PER_SEC={}); try again",
                    self.limits.per_sec
                ));
            }
            book.in_flight.insert(server.to_string());
            drop(book);
            let began = Instant::now();
            let known = self.look_up(server, fresh);
            book = sync::lock(&self.book);
            book.in_flight.remove(server);
            if known.is_err() || began.elapsed() > SLOW_LOOKUP {
                book.suspects.put(&from.to_string(), ());
            }
            match known {
                Ok(id) => {
                    book.unknown.remove(server);
                    book.verified.put(server, (Arc::new(id), fresh));
                }
                Err(e) => {
                    book.verified.remove(server);
                    book.unknown
                        .put(server, format!("{server} could not be looked up: {e}"));
                }
            }
            self.done.notify_all();
            looked_up = true;
        };
        if holding {
            if let Some(n) = book.held.get_mut(&from) {
                *n -= 1;
                if *n == 0 {
                    book.held.remove(&from);
                }
            }
            drop(book);
            self.done.notify_all();
        }
        verdict
    }

    /// Runs the lookup of `server` (a panicking lookup counts as failed).
    fn look_up(&self, server: &str, fresh: bool) -> Result<Identity, String> {
        let lookup = sync::read(&self.lookup);
        let Some(f) = lookup.as_ref() else {
            return Err("the RDMA transport cannot look peers up yet".into());
        };
        let run = std::panic::AssertUnwindSafe(|| f(server, fresh, &self.limits.rpc));
        match std::panic::catch_unwind(run) {
            Ok(r) => r.map(|r| Identity::resolve(&r)),
            Err(_) => Err("the lookup panicked".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const GID_A: &str = "00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:01";
    const GID_B: &str = "00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:01:01";

    fn limits() -> AdmissionLimits {
        AdmissionLimits {
            per_sec: 1000,
            concurrent: 2,
            capacity: 4,
            wait: Duration::from_secs(2),
            rpc: ClientOptions::default(),
        }
    }

    /// [`limits`] with one lookup slot.
    fn one_slot() -> AdmissionLimits {
        AdmissionLimits {
            concurrent: 1,
            ..limits()
        }
    }

    /// No source is held and no lookup is in flight.
    fn assert_settled(a: &Admission) {
        let b = sync::lock(&a.book);
        assert!(b.held.is_empty() && b.in_flight.is_empty());
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn gid(s: &str) -> Gid {
        parse_gid(s).unwrap()
    }

    /// An admission whose lookup knows `a:1` (127.0.0.1, device d0 with
    /// GID_A) and counts its calls.
    fn admission(l: AdmissionLimits) -> (Arc<Admission>, Arc<AtomicUsize>) {
        let a = Arc::new(Admission::new(l));
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        a.set_lookup(Box::new(move |server, _, _| {
            c.fetch_add(1, Ordering::SeqCst);
            match server {
                "a:1" => Ok(PeerRecord {
                    rpc_host: "127.0.0.1".into(),
                    devices: vec![("d0".into(), GID_A.into())],
                }),
                _ => Err("no such segment".into()),
            }
        }));
        (a, calls)
    }

    #[test]
    fn source_address_and_gid_must_be_the_published_ones() {
        let (a, calls) = admission(limits());
        assert!(
            a.check("a:1", "d0", Some(&gid(GID_A)), ip("127.0.0.1"))
                .is_ok()
        );
        assert!(a.check("a:1", "d0", None, ip("::ffff:127.0.0.1")).is_ok());
        let e = a
            .check("a:1", "d0", Some(&gid(GID_A)), ip("127.0.0.2"))
            .unwrap_err();
        assert!(e.contains("127.0.0.2"), "{e}");
        // The GID's own address is the peer's host too.
        assert!(a.check("a:1", "d0", None, ip("198.18.0.1")).is_ok());
        assert!(
            a.check("a:1", "d0", Some(&gid(GID_B)), ip("127.0.0.1"))
                .is_err()
        );
        assert!(
            a.check("a:1", "d9", Some(&gid(GID_A)), ip("127.0.0.1"))
                .is_err()
        );
        // The first failed check looked the server up afresh; later ones
        // do only REVERIFY_AFTER after that lookup.
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        std::thread::sleep(REVERIFY_AFTER + Duration::from_millis(100));
        assert!(a.check("a:1", "d0", None, ip("127.0.0.3")).is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(a.check("a:1", "d0", None, ip("127.0.0.3")).is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_peer_that_changed_its_gid_is_admitted_at_once() {
        let l = Arc::new(Admission::new(limits()));
        let published = Arc::new(Mutex::new(GID_A.to_string()));
        let calls = Arc::new(AtomicUsize::new(0));
        let (p, c) = (published.clone(), calls.clone());
        l.set_lookup(Box::new(move |_, _, _| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(PeerRecord {
                rpc_host: "127.0.0.1".into(),
                devices: vec![("d0".into(), p.lock().unwrap().clone())],
            })
        }));
        let from = ip("127.0.0.1");
        assert!(l.check("a:1", "d0", Some(&gid(GID_A)), from).is_ok());
        // It publishes a new GID and handshakes with it right away.
        *published.lock().unwrap() = GID_B.into();
        assert!(l.check("a:1", "d0", Some(&gid(GID_B)), from).is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Frames with the old GID now fail, with no further lookup.
        for _ in 0..3 {
            assert!(l.check("a:1", "d0", Some(&gid(GID_A)), from).is_err());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn unknown_servers_are_remembered_and_the_tables_are_bounded() {
        let (a, calls) = admission(limits());
        for _ in 0..3 {
            assert!(a.check("x:9", "d0", None, ip("127.0.0.2")).is_err());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "refused from the table");
        for i in 0..20 {
            let _ = a.check(&format!("m{i}:1"), "d0", None, ip("127.0.0.2"));
        }
        {
            let b = sync::lock(&a.book);
            assert!(b.unknown.entries.len() <= 4 && b.unknown.order.len() <= 4);
        }
        assert_settled(&a);
    }

    #[test]
    fn lookups_are_rate_limited() {
        let (a, calls) = admission(AdmissionLimits {
            per_sec: 5,
            ..limits()
        });
        let refused_by_rate = (0..50)
            .filter(|i| {
                a.check(&format!("m{i}:1"), "d0", None, ip("127.0.0.2"))
                    .unwrap_err()
                    .contains("MC_RDMA_PEER_LOOKUPS_PER_SEC")
            })
            .count();
        let n = calls.load(Ordering::SeqCst);
        assert!(n <= 6, "{n} lookups at 5 per second");
        assert_eq!(refused_by_rate + n, 50);
    }

    /// An admission whose lookup of `slow:1` waits for the test's signal;
    /// every server publishes 127.0.0.1 and d0 with GID_A.
    fn gated(l: AdmissionLimits) -> (Arc<Admission>, std::sync::mpsc::Sender<()>) {
        let a = Arc::new(Admission::new(l));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        a.set_lookup(Box::new(move |server, _, _| {
            match server {
                "slow:1" => {
                    let _ = sync::lock(&rx).recv_timeout(Duration::from_secs(10));
                }
                "bad:1" => return Err("no such segment".into()),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
            Ok(PeerRecord {
                rpc_host: "127.0.0.1".into(),
                devices: vec![("d0".into(), GID_A.into())],
            })
        }));
        (a, tx)
    }

    fn wait_in_flight(a: &Admission, n: usize) {
        while sync::lock(&a.book).in_flight.len() < n {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_suspect_source_gets_one_frame_checked_and_others_are_served() {
        let (a, tx) = gated(limits());
        // A failed lookup makes 127.0.0.2 a suspect.
        assert!(a.check("bad:1", "d0", None, ip("127.0.0.2")).is_err());
        let a2 = a.clone();
        let slow = std::thread::spawn(move || a2.check("slow:1", "d0", None, ip("127.0.0.2")));
        wait_in_flight(&a, 1);
        let e = a.check("other:1", "d0", None, ip("127.0.0.2")).unwrap_err();
        assert!(e.contains("being checked"), "{e}");
        assert!(a.check("fast:1", "d0", None, ip("127.0.0.1")).is_ok());
        tx.send(()).unwrap();
        assert!(
            slow.join().unwrap().is_err(),
            "127.0.0.2 is not slow:1's host"
        );
        assert_settled(&a);
    }

    #[test]
    fn a_burst_from_one_host_waits_for_the_lookup_slots() {
        // One slot; eight servers of one host at once: all verified.
        let (a, _tx) = gated(one_slot());
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let a = a.clone();
                std::thread::spawn(move || a.check(&format!("h:{i}"), "d0", None, ip("127.0.0.1")))
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(()));
        }
    }

    #[test]
    fn busy_slots_refuse_after_a_second_and_the_lookup_keeps_its_slot() {
        let (a, tx) = gated(one_slot());
        let a2 = a.clone();
        let slow = std::thread::spawn(move || a2.check("slow:1", "d0", None, ip("127.0.0.1")));
        wait_in_flight(&a, 1);
        let e = a.check("x:1", "d0", None, ip("127.0.0.3")).unwrap_err();
        assert!(e.contains("busy"), "{e}");
        tx.send(()).unwrap();
        assert_eq!(slow.join().unwrap(), Ok(()));
        assert!(a.check("x:1", "d0", None, ip("127.0.0.1")).is_ok());
    }

    #[test]
    fn gid_addresses() {
        assert_eq!(gid_address(&gid(GID_A)), Some(ip("198.18.0.1")));
        let link_local = gid("fe:80:00:00:00:00:00:00:02:00:5e:ff:fe:00:01:01");
        assert_eq!(gid_address(&link_local), None);
        let v6 = gid("20:01:0d:b8:00:00:00:00:00:00:00:00:00:00:00:05");
        assert_eq!(gid_address(&v6), Some(ip("2001:db8::5")));
    }
}
