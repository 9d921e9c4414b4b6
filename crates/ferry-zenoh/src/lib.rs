//! ferry's bridge between hosts: named services of one ferry group carried over zenoh.
//!
//! One bridge runs per host and group. It joins the group as an ordinary member:
//!
//! - **Export.** For each service of the group that its [`Policy`] lets through, it
//!   subscribes (publish-subscribe) or opens a client (request-response) like any other
//!   member, and carries the messages to `ferry/<scope>/<service>` with remote-only
//!   locality, so nothing on this host ever sees a second copy. Each exported service
//!   has a liveliness token (`ferry-live/<scope>/<zid>/<kind>/<service>`) and a queryable
//!   that answers its configuration (`ferry-config/<scope>/<zid>/<service>`).
//! - **Import.** For each token another bridge holds, it offers the same service in its
//!   own group (a [`Publisher`] or a [`Server`]) and republishes what arrives through a
//!   publisher loan: one copy from the network into an fbuf, then zero-copy to every
//!   local subscriber. When the far end ends (its publisher or its bridge dies, or the
//!   service is withdrawn) the bridge drops that publisher, and local subscribers see
//!   the end exactly as they see a local publisher go.
//!
//! - **Who is where.** The bridge records, in the service table, what `ferry stat`
//!   shows: on the importing host, the service's owner (the bridge) says which host it
//!   comes from ([`Publisher::set_bridged_from`]); on the exporting host, the bridge's
//!   subscription (or client) says which hosts it carries the service to
//!   ([`Subscriber::set_carried_to`]). An importing bridge holds a token
//!   (`ferry-uses/<scope>/<exporter zid>/<its zid>/<its host>/<service>`) while it
//!   imports, so the exporter knows its far ends, and a configuration answer names the
//!   exporter's host. These records are only shown, never used to decide anything.
//!
//! The scope names the set of bridges that see each other's services; it defaults to the
//! group's name, so that two hosts running a group of the same name are bridged as they
//! are.

pub mod policy;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ferry::{
    Client, Domain, Error, Group, IoData, IoDataMut, PathAllocator, PathConfig, Publisher, Server,
    ServiceConfig, ServiceKind, SlowSubscriber, Subscriber,
};
use zenoh::bytes::ZBytes;
use zenoh::handlers::{FifoChannel, RingChannel};
use zenoh::qos::CongestionControl;
use zenoh::sample::{Locality, SampleKind};
use zenoh::{Session, Wait};

pub use policy::Policy;

/// Status a bridged [`Client::call`] fails with when the far end gave no answer within
/// the bridge's call timeout (unreachable, or its server too slow).
pub const STATUS_NO_ANSWER: u32 = 0xB0;
/// Status a bridged call fails with when the far bridge could not reach its server.
pub const STATUS_FAR_SERVER_GONE: u32 = 0xB1;

/// How long a worker blocks before it looks at its stop flag again.
const POLL: Duration = Duration::from_millis(50);
/// How often the bridge looks for new local services and reports its peers.
const SCAN: Duration = Duration::from_millis(100);
/// How long an import that failed waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// A bridge's settings.
#[derive(Clone, Debug)]
pub struct BridgeConfig {
    /// The local ferry group.
    pub group: String,
    /// The set of bridges that see each other (one zenoh key chunk); `None`: the group's
    /// name.
    pub scope: Option<String>,
    /// zenoh endpoints to listen on (`tcp/10.0.0.1:7447`).
    pub listen: Vec<String>,
    /// zenoh endpoints of other bridges to connect to (retried until they answer).
    pub connect: Vec<String>,
    /// Which services cross, both ways.
    pub policy: Policy,
    /// Larger messages are not carried (counted and reported).
    pub max_message: usize,
    /// How long a bridged request waits for the far end's answer.
    pub call_timeout: Duration,
    /// zenoh's multicast scouting (off: only the endpoints given are used).
    pub multicast_scouting: bool,
    /// Print what the bridge does (exports, imports, peers) on stdout.
    pub log: bool,
}

impl BridgeConfig {
    /// A bridge of group `group` with the defaults: scope = group, no endpoints, every
    /// service, 256 MiB messages at most, calls of 5 s, no multicast scouting.
    pub fn new(group: &str) -> BridgeConfig {
        BridgeConfig {
            group: group.to_owned(),
            scope: None,
            listen: Vec::new(),
            connect: Vec::new(),
            policy: Policy::default(),
            max_message: 256 << 20,
            call_timeout: Duration::from_secs(5),
            multicast_scouting: false,
            log: true,
        }
    }

    fn scope(&self) -> &str {
        self.scope.as_deref().unwrap_or(&self.group)
    }

    /// The zenoh configuration: peer mode, the endpoints given, scouting as asked.
    pub fn zenoh_config(&self) -> Result<zenoh::Config> {
        zenoh_config(&self.listen, &self.connect, self.multicast_scouting)
    }
}

/// Each link's receive buffer. zenoh receives into a pool of batch-sized (64 KiB)
/// buffers of this much in all, and a message received in fragments holds one per
/// fragment until it is taken; with the default (one buffer) every batch of a large
/// message is a fresh allocation, zeroed and faulted in, and freed again.
pub const RX_BUFFER: usize = 16 << 20;

/// A peer-mode zenoh configuration with explicit endpoints (also used by the benchmark's
/// baseline, so that both go the same way).
pub fn zenoh_config(
    listen: &[String],
    connect: &[String],
    multicast: bool,
) -> Result<zenoh::Config> {
    let mut c = zenoh::Config::default();
    let set = |c: &mut zenoh::Config, k: &str, v: String| {
        c.insert_json5(k, &v)
            .map_err(|e| anyhow!("zenoh config {k} = {v}: {e}"))
    };
    let list = |v: &[String]| {
        let quoted: Vec<String> = v.iter().map(|e| format!("{e:?}")).collect();
        format!("[{}]", quoted.join(","))
    };
    set(&mut c, "mode", "\"peer\"".into())?;
    set(&mut c, "listen/endpoints", list(listen))?;
    set(&mut c, "connect/endpoints", list(connect))?;
    set(&mut c, "scouting/multicast/enabled", multicast.to_string())?;
    // Gossip would tell peers about endpoints they were not given.
    set(&mut c, "scouting/gossip/enabled", "false".into())?;
    set(
        &mut c,
        "transport/link/rx/buffer_size",
        (RX_BUFFER).to_string(),
    )?;
    Ok(c)
}

/// The key a service's messages (or calls) travel on.
pub fn data_key(scope: &str, service: &str) -> String {
    format!("ferry/{scope}/{service}")
}

fn live_prefix(scope: &str) -> String {
    format!("ferry-live/{scope}/")
}

fn config_key(scope: &str, zid: &str, service: &str) -> String {
    format!("ferry-config/{scope}/{zid}/{service}")
}

fn uses_prefix(scope: &str, exporter: &str) -> String {
    format!("ferry-uses/{scope}/{exporter}/")
}

/// This host's name as one zenoh key chunk, for the other bridges to show.
fn host_name() -> String {
    clean_host(&std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default())
}

/// A host name as this bridge writes and shows it: at most 40 letters, digits, `.`,
/// `-` or `_` (anything else becomes `_`), whatever a far bridge sent.
fn clean_host(raw: &str) -> String {
    let name: String = raw
        .trim()
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "unknown".to_owned()
    } else {
        name
    }
}

/// How a far bridge is named in the service table: `host (zid)`, both cleaned as
/// host names are (a far bridge chose them).
fn far_name(host: &str, zid: &str) -> String {
    format!("{} ({})", clean_host(host), clean_host(zid))
}

/// The far ends a service is carried to, as one note of at most [`ferry::MAX_FAR`]
/// bytes: as many as fit, then how many more.
fn far_list(far: &std::collections::BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (k, (zid, host)) in far.iter().enumerate() {
        let next = far_name(host, zid);
        let sep = if out.is_empty() { "" } else { ", " };
        let more = format!(" +{} more", far.len() - k);
        if out.len() + sep.len() + next.len() + more.len() + 8 > ferry::MAX_FAR {
            out.push_str(&more);
            break;
        }
        out.push_str(sep);
        out.push_str(&next);
    }
    out
}

/// Whether `name` can be a run of zenoh key chunks as it is: no wildcard or reserved
/// characters, no empty chunk, no verbatim (`@`) chunk. Other names are not bridged.
pub fn bridgeable(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('/')
            .all(|c| !c.is_empty() && !c.starts_with('@') && !c.contains(['*', '$', '?', '#']))
}

/// A service's settings as one key chunk of its liveliness token: `ps-drop-64`,
/// `ps-block-8`, `rr-64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    kind: ServiceKind,
    slow: SlowSubscriber,
    depth: u32,
}

impl Shape {
    fn tag(&self) -> String {
        match (self.kind, self.slow) {
            (ServiceKind::ReqResp, _) => format!("rr-{}", self.depth),
            (_, SlowSubscriber::Drop) => format!("ps-drop-{}", self.depth),
            (_, SlowSubscriber::Block) => format!("ps-block-{}", self.depth),
        }
    }

    fn parse(tag: &str) -> Option<Shape> {
        let (head, depth) = tag.rsplit_once('-')?;
        let depth: u32 = depth.parse().ok()?;
        let (kind, slow) = match head {
            "rr" => (ServiceKind::ReqResp, SlowSubscriber::Drop),
            "ps-drop" => (ServiceKind::PubSub, SlowSubscriber::Drop),
            "ps-block" => (ServiceKind::PubSub, SlowSubscriber::Block),
            _ => return None,
        };
        (depth.is_power_of_two() && (2..=1 << 16).contains(&depth)).then_some(Shape {
            kind,
            slow,
            depth,
        })
    }

    fn service_config(&self) -> ServiceConfig {
        ServiceConfig {
            depth: self.depth,
            slow: self.slow,
            ..ServiceConfig::default()
        }
    }
}

/// What every worker thread shares.
struct Ctx {
    group: Arc<ferry::Group>,
    domain: Domain,
    session: Session,
    scope: String,
    zid: String,
    /// This host's name, as the other bridges show it.
    host: String,
    max_message: usize,
    call_timeout: Duration,
    /// For the copies from the network into fbufs of request-response traffic.
    path: PathAllocator,
    log: bool,
}

macro_rules! say {
    ($ctx:expr, $($arg:tt)*) => {
        if $ctx.log {
            println!("ferry-bridge[{}]: {}", $ctx.group.name(), format!($($arg)*))
        }
    };
}

/// How a worker ended.
enum End {
    /// Asked to stop.
    Stopped,
    /// The far end (or the local owner) ended the service.
    Ended,
}

struct Worker {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<End>>,
}

impl Worker {
    /// A worker thread named `name` (as `top -H` and the scheduler's traces show it).
    fn spawn(
        ctx: &Arc<Ctx>,
        name: &str,
        f: impl FnOnce(&Ctx, &AtomicBool) -> Result<End> + Send + 'static,
    ) -> Worker {
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (ctx.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || f(&c, &s))
            .expect("starting a bridge worker thread");
        Worker { stop, handle }
    }

    /// Stops the worker and waits for it.
    fn finish(self) -> Result<End> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .join()
            .map_err(|_| anyhow!("bridge worker panicked"))?
    }
}

/// An export: the local owner it follows and its worker.
struct Export {
    owner: ferry::Member,
    worker: Worker,
}

/// An import: the far bridge whose token it follows and its worker (`None` while it
/// waits to be tried again).
struct Import {
    zid: String,
    shape: Shape,
    worker: Option<Worker>,
    retry_at: Instant,
}

/// Runs a bridge until `stop` is set (or it fails to start): exports this host's
/// services and imports the other bridges'. Returns once every worker stopped, its
/// offered services are withdrawn and its zenoh session is closed.
pub fn run(config: &BridgeConfig, stop: &AtomicBool) -> Result<()> {
    let group =
        Group::open(&config.group).with_context(|| format!("opening group {}", config.group))?;
    run_in(group, config, stop)
}

/// [`run`] in a group this process already has open (a process maps each group once),
/// as a bridge on a thread beside the group's other members does; `config.group` is
/// not used.
pub fn run_in(group: Arc<Group>, config: &BridgeConfig, stop: &AtomicBool) -> Result<()> {
    let scope = config.scope().to_owned();
    if scope.is_empty() || scope.contains('/') || !bridgeable(&scope) {
        bail!("scope {scope:?} must be one zenoh key chunk (no '/', '*', '$', '?', '#', '@')");
    }
    let domain = group.join().context("joining the group")?;
    let session = zenoh::open(config.zenoh_config()?)
        .wait()
        .map_err(|e| anyhow!("opening the zenoh session: {e}"))?;
    let zid = session.zid().to_string();
    let ctx = Arc::new(Ctx {
        path: domain.path(PathConfig::default())?,
        group,
        domain,
        session,
        scope,
        zid,
        host: host_name(),
        max_message: config.max_message,
        call_timeout: config.call_timeout,
        log: config.log,
    });
    say!(
        ctx,
        "scope {} zid {} host {} listen {:?} connect {:?}",
        ctx.scope,
        ctx.zid,
        ctx.host,
        config.listen,
        config.connect
    );
    let result = serve(&ctx, config, stop);
    say!(ctx, "stopping");
    if let Err(e) = ctx.session.close().wait() {
        say!(ctx, "closing the zenoh session: {e}");
    }
    result
}

fn serve(ctx: &Arc<Ctx>, config: &BridgeConfig, stop: &AtomicBool) -> Result<()> {
    let live = ctx
        .session
        .liveliness()
        .declare_subscriber(format!("{}**", live_prefix(&ctx.scope)))
        .history(true)
        .with(FifoChannel::new(1024))
        .wait()
        .map_err(|e| anyhow!("watching the other bridges' tokens: {e}"))?;
    let mut exports: HashMap<String, Export> = HashMap::new();
    let mut imports: HashMap<String, Import> = HashMap::new();
    let mut peers: Option<usize> = None;
    let mut next_peer_check = Instant::now();
    let me = ctx.domain.id();
    while !stop.load(Ordering::Relaxed) {
        // Other bridges' tokens: start and stop imports.
        while let Ok(Some(s)) = live.try_recv() {
            let key = s.key_expr().as_str();
            let Some((zid, shape, name)) = parse_token(&ctx.scope, key) else {
                continue;
            };
            if zid == ctx.zid {
                continue;
            }
            match s.kind() {
                SampleKind::Put => {
                    if !config.policy.passes(name) {
                        say!(ctx, "not importing {name}: denied by policy");
                        continue;
                    }
                    if let Some(i) = imports.get(name) {
                        if i.zid != zid
                            && i.worker.as_ref().is_some_and(|w| !w.handle.is_finished())
                        {
                            say!(
                                ctx,
                                "not importing {name} from {zid}: {} offers it already",
                                i.zid
                            );
                            continue;
                        }
                    }
                    if let Some(old) = imports.remove(name) {
                        stop_import(ctx, name, old);
                    }
                    imports.insert(
                        name.to_owned(),
                        Import {
                            zid: zid.to_owned(),
                            shape,
                            worker: Some(spawn_import(ctx, name, zid, shape)),
                            retry_at: Instant::now(),
                        },
                    );
                }
                SampleKind::Delete => {
                    if imports.get(name).is_some_and(|i| i.zid == zid) {
                        let i = imports.remove(name).expect("present");
                        stop_import(ctx, name, i);
                        say!(ctx, "{name}: far end gone ({zid})");
                    }
                }
            }
        }
        // Imports whose worker ended: done if the far end ended, else tried again.
        let now = Instant::now();
        let mut ended = Vec::new();
        for (name, i) in imports.iter_mut() {
            if i.worker.as_ref().is_some_and(|w| w.handle.is_finished()) {
                let w = i.worker.take().expect("checked");
                match w.finish() {
                    Ok(End::Ended) | Ok(End::Stopped) => ended.push(name.clone()),
                    Err(e) => {
                        say!(ctx, "import of {name} failed: {e:#}; retrying");
                        i.retry_at = now + RETRY;
                    }
                }
            } else if i.worker.is_none() && now >= i.retry_at {
                i.worker = Some(spawn_import(ctx, name, &i.zid, i.shape));
            }
        }
        for name in ended {
            imports.remove(&name);
        }
        // Local services: start exports of new ones, stop those whose owner went.
        let services = ctx.group.services();
        exports.retain(|name, e| {
            let current = services
                .iter()
                .any(|s| &s.name == name && s.owner == e.owner);
            if current && !e.worker.handle.is_finished() {
                return true;
            }
            e.worker.stop.store(true, Ordering::Relaxed);
            false
        });
        for s in &services {
            if s.owner.id == me
                || exports.contains_key(&s.name)
                || !bridgeable(&s.name)
                || !config.policy.passes(&s.name)
            {
                continue;
            }
            let shape = Shape {
                kind: s.kind,
                slow: s.slow,
                depth: s.depth,
            };
            let name = s.name.clone();
            let worker = Worker::spawn(ctx, "bridge-export", move |c, stop| {
                export(c, &name, shape, stop)
            });
            exports.insert(
                s.name.clone(),
                Export {
                    owner: s.owner,
                    worker,
                },
            );
        }
        if now >= next_peer_check {
            next_peer_check = now + Duration::from_secs(1);
            let n = ctx.session.info().peers_zid().wait().count();
            if peers != Some(n) {
                if n == 0 && !config.connect.is_empty() {
                    say!(ctx, "no peer reachable at {:?}; retrying", config.connect);
                } else {
                    say!(ctx, "{n} peer(s) connected");
                }
                peers = Some(n);
            }
        }
        std::thread::sleep(SCAN);
    }
    for (name, i) in imports.drain() {
        stop_import(ctx, &name, i);
    }
    for (name, e) in exports.drain() {
        if let Err(e) = e.worker.finish() {
            say!(ctx, "export of {name}: {e:#}");
        }
    }
    Ok(())
}

fn stop_import(ctx: &Ctx, name: &str, i: Import) {
    if let Some(w) = i.worker {
        if let Err(e) = w.finish() {
            say!(ctx, "import of {name}: {e:#}");
        }
    }
}

/// `ferry-live/<scope>/<zid>/<tag>/<service>` split into its parts.
fn parse_token<'a>(scope: &str, key: &'a str) -> Option<(&'a str, Shape, &'a str)> {
    let rest = key.strip_prefix(&live_prefix(scope))?;
    let (zid, rest) = rest.split_once('/')?;
    let (tag, name) = rest.split_once('/')?;
    Some((zid, Shape::parse(tag)?, name))
}

fn spawn_import(ctx: &Arc<Ctx>, name: &str, zid: &str, shape: Shape) -> Worker {
    let (name, zid) = (name.to_owned(), zid.to_owned());
    Worker::spawn(ctx, "bridge-import", move |c, stop| match shape.kind {
        ServiceKind::PubSub => import_pubsub(c, &name, &zid, shape, stop),
        ServiceKind::ReqResp => import_reqresp(c, &name, &zid, shape, stop),
    })
}

/// The token and configuration queryable of one exported service; dropping them tells
/// the other bridges it is gone.
struct Announcement<Q> {
    _token: zenoh::liveliness::LivelinessToken,
    config: zenoh::query::Queryable<Q>,
}

/// What a service's configuration queryable answers.
fn config_answer(ctx: &Ctx, shape: Shape) -> String {
    format!(
        "kind={} depth={} slow={} max={} host={}",
        if shape.kind == ServiceKind::PubSub {
            "ps"
        } else {
            "rr"
        },
        shape.depth,
        if shape.slow == SlowSubscriber::Block {
            "block"
        } else {
            "drop"
        },
        ctx.max_message,
        ctx.host
    )
}

/// The far bridge's name for the service table, from its configuration answer.
fn far_from_config(zid: &str, answer: &str) -> String {
    let host = answer
        .split(' ')
        .find_map(|kv| kv.strip_prefix("host="))
        .unwrap_or("");
    far_name(host, zid)
}

/// The token an importing bridge holds while it imports `name` from `zid`, so that
/// the exporter can say where it carries it.
fn declare_use(ctx: &Ctx, zid: &str, name: &str) -> Result<zenoh::liveliness::LivelinessToken> {
    ctx.session
        .liveliness()
        .declare_token(format!(
            "{}{}/{}/{name}",
            uses_prefix(&ctx.scope, zid),
            ctx.zid,
            ctx.host
        ))
        .wait()
        .map_err(|e| anyhow!("declaring the use of {name}: {e}"))
}

/// The importing bridges of one exported service, from their tokens: zid to host.
struct FarEnds {
    watch: zenoh::pubsub::Subscriber<zenoh::handlers::FifoChannelHandler<zenoh::sample::Sample>>,
    prefix: String,
    name: String,
    far: std::collections::BTreeMap<String, String>,
}

impl FarEnds {
    fn watch(ctx: &Ctx, name: &str) -> Result<FarEnds> {
        let prefix = uses_prefix(&ctx.scope, &ctx.zid);
        let watch = ctx
            .session
            .liveliness()
            .declare_subscriber(format!("{prefix}*/*/{name}"))
            .history(true)
            .with(FifoChannel::new(64))
            .wait()
            .map_err(|e| anyhow!("watching {name}'s importers: {e}"))?;
        Ok(FarEnds {
            watch,
            prefix,
            name: name.to_owned(),
            far: Default::default(),
        })
    }

    /// Takes in the tokens that came and went; true if the set changed.
    fn update(&mut self) -> bool {
        let mut changed = false;
        while let Ok(Some(s)) = self.watch.try_recv() {
            let Some((zid, host)) = s
                .key_expr()
                .as_str()
                .strip_prefix(&self.prefix)
                .and_then(|r| r.strip_suffix(self.name.as_str()))
                .and_then(|r| r.strip_suffix('/'))
                .and_then(|r| r.split_once('/'))
            else {
                continue;
            };
            changed |= match s.kind() {
                SampleKind::Put => self.far.insert(zid.to_owned(), host.to_owned()).is_none(),
                SampleKind::Delete => self.far.remove(zid).is_some(),
            };
        }
        changed
    }
}

/// Declares the service's configuration queryable (with `handler`), then its token.
fn announce<H>(ctx: &Ctx, name: &str, shape: Shape, handler: H) -> Result<Announcement<H::Handler>>
where
    H: zenoh::handlers::IntoHandler<zenoh::query::Query> + Send,
    H::Handler: Send,
{
    let config = ctx
        .session
        .declare_queryable(config_key(&ctx.scope, &ctx.zid, name))
        .allowed_origin(Locality::Remote)
        .with(handler)
        .wait()
        .map_err(|e| anyhow!("declaring the config queryable of {name}: {e}"))?;
    let token = ctx
        .session
        .liveliness()
        .declare_token(format!(
            "{}{}/{}/{name}",
            live_prefix(&ctx.scope),
            ctx.zid,
            shape.tag()
        ))
        .wait()
        .map_err(|e| anyhow!("declaring the token of {name}: {e}"))?;
    Ok(Announcement {
        _token: token,
        config,
    })
}

/// [`announce`] with a queryable that answers at once, from zenoh's own threads.
fn announce_answering(ctx: &Ctx, name: &str, shape: Shape) -> Result<Announcement<()>> {
    let answer = config_answer(ctx, shape);
    announce(
        ctx,
        name,
        shape,
        zenoh::handlers::Callback::from(move |q: zenoh::query::Query| {
            let _ = q.reply(q.key_expr().clone(), answer.clone()).wait();
        }),
    )
}

/// Asks the far bridge for the service's configuration. Being a round trip after any
/// declaration made before it, it also makes sure the far end knows those.
fn far_config(ctx: &Ctx, zid: &str, name: &str) -> Result<String> {
    let replies = ctx
        .session
        .get(config_key(&ctx.scope, zid, name))
        .allowed_destination(Locality::Remote)
        .timeout(Duration::from_secs(5))
        .wait()
        .map_err(|e| anyhow!("asking for {name}'s configuration: {e}"))?;
    let reply = replies
        .recv()
        .map_err(|_| anyhow!("no answer about {name} from {zid}"))?;
    let sample = reply
        .result()
        .map_err(|e| anyhow!("{zid} refused {name}'s configuration: {e:?}"))?;
    Ok(sample.payload().try_to_string()?.into_owned())
}

fn export(ctx: &Ctx, name: &str, shape: Shape, stop: &AtomicBool) -> Result<End> {
    match shape.kind {
        ServiceKind::PubSub => export_pubsub(ctx, name, shape, stop),
        ServiceKind::ReqResp => export_reqresp(ctx, name, shape, stop),
    }
}

/// A message's bytes for zenoh without a copy: each fragment is lent as it is (the
/// fbufs go back once zenoh has written them out).
fn to_zbytes(d: IoData) -> ZBytes {
    struct Frag(IoData);
    impl AsRef<[u8]> for Frag {
        fn as_ref(&self) -> &[u8] {
            self.0.chunks().next().unwrap_or(&[])
        }
    }
    if d.num_fragments() <= 1 {
        return ZBytes::from(bytes::Bytes::from_owner(Frag(d)));
    }
    let mut w = ZBytes::writer();
    let mut at = 0;
    let lens: Vec<usize> = d.chunks().map(|c| c.len()).collect();
    for len in lens {
        w.append(ZBytes::from(bytes::Bytes::from_owner(Frag(
            d.slice(at..at + len),
        ))));
        at += len;
    }
    w.finish()
}

/// How long after answering a configuration query an export stays subscribed even
/// though zenoh does not (yet) report the asking bridge's subscription.
const HOLD: Duration = Duration::from_secs(5);

/// Exports a publish-subscribe service. The bridge subscribes locally only while a far
/// bridge subscribes to the service's key (zenoh's matching status of the publisher,
/// which counts remote subscribers only), so a host whose services nobody imports
/// pays nothing for its bridge: its publishers store to and wake no extra queue. A far
/// bridge asks for the configuration after it subscribed and before it offers the
/// service in its group; the query is answered here, once this bridge is subscribed,
/// so that everything published after the far end offers the service reaches it.
fn export_pubsub(ctx: &Ctx, name: &str, shape: Shape, stop: &AtomicBool) -> Result<End> {
    let zpub = ctx
        .session
        .declare_publisher(data_key(&ctx.scope, name))
        .congestion_control(match shape.slow {
            SlowSubscriber::Drop => CongestionControl::Drop,
            SlowSubscriber::Block => CongestionControl::Block,
        })
        .allowed_destination(Locality::Remote)
        .wait()
        .map_err(|e| anyhow!("declaring the publisher of {name}: {e}"))?;
    // A blocking service's large messages go in chunks, but not from a bridge that may
    // use one CPU only: there the chunks' puts and the far side's work take turns rather
    // than overlap, and a message sent whole is quicker.
    let chunked = shape.slow == SlowSubscriber::Block && chunking_helps();
    let matching = zpub
        .matching_listener()
        .with(FifoChannel::new(64))
        .wait()
        .map_err(|e| anyhow!("watching {name}'s far subscribers: {e}"))?;
    let mut wanted = zpub
        .matching_status()
        .wait()
        .map_err(|e| anyhow!("{name}'s far subscribers: {e}"))?
        .matching();
    let announced = announce(ctx, name, shape, FifoChannel::new(64))?;
    let answer = config_answer(ctx, shape);
    let mut far_ends = FarEnds::watch(ctx, name)?;
    let large = match (chunked, shape.slow) {
        (true, _) => format!("; messages over {CHUNK} B in chunks"),
        (false, SlowSubscriber::Block) => "; large messages whole: one CPU".to_owned(),
        (false, SlowSubscriber::Drop) => String::new(),
    };
    say!(ctx, "exporting {name} ({}{large})", shape.tag());
    let mut sub: Option<Subscriber> = None;
    let mut hold_until: Option<Instant> = None;
    let mut too_large = 0u64;
    let end = loop {
        if stop.load(Ordering::Relaxed) {
            break End::Stopped;
        }
        while let Ok(Some(m)) = matching.try_recv() {
            wanted = m.matching();
        }
        let mut queries = Vec::new();
        while let Ok(Some(q)) = announced.config.try_recv() {
            queries.push(q);
        }
        if !queries.is_empty() {
            hold_until = Some(Instant::now() + HOLD);
        }
        let held = hold_until.is_some_and(|t| Instant::now() < t);
        if sub.is_none() && (wanted || held) {
            let mut s = Subscriber::open(&ctx.domain, name, Duration::from_secs(1))
                .with_context(|| format!("subscribing to {name}"))?;
            // A local subscriber's hand-over must not wait for the bridge's wake-up.
            s.set_wake_last(true);
            sub = Some(s);
            say!(ctx, "{name}: a far bridge subscribes; carrying");
            far_ends.update();
            note_carried(ctx, name, sub.as_ref(), &far_ends);
        } else if sub.is_some() && !wanted && !held {
            sub = None;
            say!(ctx, "{name}: no far subscriber; not carrying");
        }
        if far_ends.update() {
            note_carried(ctx, name, sub.as_ref(), &far_ends);
        }
        for q in queries {
            let _ = q.reply(q.key_expr().clone(), answer.clone()).wait();
        }
        let Some(s) = sub.as_mut() else {
            // Nothing to carry: wait for a far subscriber (or a query) to come.
            if let Ok(Some(m)) = matching.recv_timeout(POLL) {
                wanted = m.matching();
            }
            continue;
        };
        match s.recv_timeout(POLL) {
            Ok(d) => {
                if d.len() > ctx.max_message {
                    too_large += 1;
                    if too_large.is_power_of_two() {
                        say!(
                            ctx,
                            "{name}: {too_large} message(s) over the limit not carried"
                        );
                    }
                    continue;
                }
                let put = if chunked && d.len() > CHUNK {
                    put_chunks(&zpub, &ctx.zid, d)
                } else {
                    zpub.put(to_zbytes(d)).wait()
                };
                put.map_err(|e| anyhow!("putting {name}: {e}"))?;
            }
            Err(Error::Timeout) => {}
            Err(Error::PeerGone { .. } | Error::Disconnected) => break End::Ended,
            Err(e) => return Err(e).with_context(|| format!("receiving {name}")),
        }
    };
    // The end, in order after the last message: the far bridges withdraw the service at
    // once, before the token's removal reaches them.
    let _ = zpub.delete().wait();
    drop(announced);
    say!(ctx, "{name}: export ended");
    Ok(end)
}

/// Records in the service table which far ends `sub` carries the service to.
fn note_carried(ctx: &Ctx, name: &str, sub: Option<&Subscriber>, far: &FarEnds) {
    if let Some(s) = sub {
        if let Err(e) = s.set_carried_to(&far_list(&far.far)) {
            say!(ctx, "{name}: recording its far ends: {e}");
        }
    }
}

fn import_pubsub(ctx: &Ctx, name: &str, zid: &str, shape: Shape, stop: &AtomicBool) -> Result<End> {
    if shape.slow == SlowSubscriber::Block {
        return import_blocking(ctx, name, zid, shape, stop);
    }
    let key = data_key(&ctx.scope, name);
    let depth = shape.depth as usize;
    // A dropping service keeps the newest messages when this side falls behind.
    let ring = ctx
        .session
        .declare_subscriber(&key)
        .allowed_origin(Locality::Remote)
        .with(RingChannel::new(depth))
        .wait()
        .map_err(|e| anyhow!("subscribing to {key}: {e}"))?;
    let far = far_from_config(zid, &far_config(ctx, zid, name)?);
    let mut publisher = Publisher::offer(&ctx.domain, name, shape.service_config())
        .with_context(|| format!("offering {name} locally"))?;
    publisher.set_bridged_from(&far)?;
    let _using = declare_use(ctx, zid, name)?;
    say!(ctx, "importing {name} from {zid} ({})", shape.tag());
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(End::Stopped);
        }
        let Ok(Some(sample)) = ring.recv_timeout(POLL) else {
            continue;
        };
        if sample.kind() == SampleKind::Delete {
            say!(ctx, "{name}: the far end ended it");
            return Ok(End::Ended);
        }
        let payload = sample.payload();
        let len = payload.len();
        if len > ctx.max_message {
            continue;
        }
        let mut loan = match publisher.loan(len) {
            Ok(l) => l,
            Err(e) => {
                if !room_for_loan(&mut publisher, len, e, stop)? {
                    continue;
                }
                match publisher.loan(len) {
                    Ok(l) => l,
                    // Still no room: this message is lost, as a full queue loses one.
                    Err(Error::QuotaExceeded { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let dst = loan.as_mut_slice();
        copy_payload(payload, 0, |at, s| dst[at..at + s.len()].copy_from_slice(s));
        loan.send()?;
    }
}

/// Larger messages of a blocking service travel as chunks of this many bytes (the last
/// one shorter; see [`chunks`]), each with a [`chunk_tag`] attachment and small enough
/// for one of zenoh's batches (at most 64 KiB, headers included), so that zenoh never
/// fragments them. The receiving bridge copies each chunk into the message's fbuf as it
/// arrives, while the next is still on the way: a message sent whole would reach it only
/// once its last fragment came, and be copied then. Larger chunks, split by zenoh into
/// fragments, save no CPU on the sending side (nearly all of a `put`'s is the copy into
/// zenoh's batches, the same for chunks and fragments) and each reaches the far side's
/// copy only once whole; 256 KiB chunks also left a partly filled batch waiting.
pub const CHUNK: usize = 63 << 10;

/// Whether this thread's exports chunk large messages: only if it may use more than one
/// CPU (its affinity, which the threads it starts inherit, and the cgroup's CPU quota:
/// `available_parallelism`). On one CPU the exporting bridge's chunk puts and the far
/// side's receiving take turns instead of overlapping, and a 1 MiB message took about
/// twice as long as sent whole.
fn chunking_helps() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
}

/// The byte ranges a message of `total` bytes travels in: [`CHUNK`]s, the last shorter.
fn chunks(total: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..total)
        .step_by(CHUNK)
        .map(move |at| at..(at + CHUNK).min(total))
}

/// A chunk's attachment: the message's length, the chunk's offset in it and the zid of
/// the bridge that sent it. Another host may export a service of the same name to the
/// same key; its chunks are told apart by the zid, so that two messages' chunks are
/// never put together into one.
fn chunk_tag(from: &str, total: usize, offset: usize) -> ZBytes {
    let mut t = Vec::with_capacity(16 + from.len());
    t.extend_from_slice(&(total as u64).to_le_bytes());
    t.extend_from_slice(&(offset as u64).to_le_bytes());
    t.extend_from_slice(from.as_bytes());
    ZBytes::from(t)
}

/// What a sample's attachment says it is.
#[derive(Debug, PartialEq)]
enum Tag {
    /// A message sent whole (no [`chunk_tag`]).
    Whole,
    /// A chunk from the bridge the import follows: the message's length and its offset.
    Chunk(usize, usize),
    /// A chunk from another bridge exporting a service of the same name.
    Foreign,
}

/// A [`chunk_tag`] read back, for an import that follows the bridge `from`.
fn parse_chunk_tag(tag: Option<&ZBytes>, from: &str) -> Tag {
    let Some(t) = tag.map(ZBytes::to_bytes) else {
        return Tag::Whole;
    };
    if t.len() < 16 {
        return Tag::Whole;
    }
    if &t[16..] != from.as_bytes() {
        return Tag::Foreign;
    }
    let word = |i: usize| u64::from_le_bytes(t[i..i + 8].try_into().expect("8 bytes")) as usize;
    Tag::Chunk(word(0), word(8))
}

/// Puts `d` in its [`chunks`] (each lent without a copy), in order, each tagged with
/// its offset and this bridge's zid (`from`).
fn put_chunks(zpub: &zenoh::pubsub::Publisher<'_>, from: &str, d: IoData) -> zenoh::Result<()> {
    let total = d.len();
    for r in chunks(total) {
        let at = r.start;
        zpub.put(to_zbytes(d.slice(r)))
            .attachment(chunk_tag(from, total, at))
            .wait()?;
    }
    Ok(())
}

/// A blocking service's import. Each message is copied into an fbuf in zenoh's
/// receiving thread as it arrives (a chunked one chunk by chunk) and published to the
/// local subscribers there, with no hand-over to a thread of the bridge (whose wake-up
/// per message costs about as much as copying a small message). The receiving thread
/// never waits for a local subscriber: a publish that finds a subscriber's queue full,
/// a message that finds no room in the path, and any message behind them go to the
/// import's own thread, in order. Only once `depth` messages wait for that thread does
/// the receiving thread wait, and so hold up the network and the far publisher, as a
/// blocking service must (as zenoh's own queue to a thread does once full).
struct Inflow {
    queue: Mutex<Queue>,
    /// Signalled when the queue changes in a way that a waiting thread needs: an item
    /// came while the import's thread sleeps, one left while a receiving thread waits
    /// for room, the publisher is free with items queued. Only then: a signal is a system
    /// call even when nobody waits, and one per message woke the import's thread for
    /// every message the receiving thread had published itself.
    changed: Condvar,
    /// The local publisher, once the service is offered.
    publisher: Mutex<Option<Publisher>>,
    /// Where the receiving thread copies messages to (`None`: the import's thread
    /// copies every message, into the publisher's path).
    path: Option<PathAllocator>,
    /// The chunked message being received.
    assembly: Mutex<Option<Assembly>>,
    /// The zid of the far bridge this import follows: chunks from any other are not
    /// its service's.
    from: String,
    /// Set once the import ends: nothing waits for local subscribers any more.
    halt: AtomicBool,
    /// The messages that may wait for the import's thread.
    depth: usize,
    max_message: usize,
}

/// What waits for the import's thread.
enum Item {
    /// A message copied into an fbuf already.
    Ready(IoData),
    /// A message still in zenoh's buffers (whole, or its chunks in order): the path had
    /// no room for it in the receiving thread.
    Raw(Vec<ZBytes>),
    /// A publish begun in the receiving thread that found full queues, to be waited on.
    Begun(ferry::Publishing),
    /// The far end ended the service.
    End,
}

/// A chunked message as its chunks arrive.
struct Assembly {
    total: usize,
    /// Bytes received so far (the next chunk's offset).
    next: usize,
    /// The fbuf the chunks are copied into, or the chunks themselves if the path had no
    /// room.
    into: std::result::Result<IoDataMut, Vec<ZBytes>>,
}

#[derive(Default)]
struct Queue {
    /// Work for the import's thread, in order.
    items: VecDeque<Item>,
    /// A message is being published (by either thread): the next may not overtake it.
    busy: bool,
    /// The service is offered locally; until then the newest `depth` messages wait in
    /// `items`.
    open: bool,
    /// Publishing failed in the receiving thread.
    failed: Option<String>,
    /// The import's thread sleeps, waiting for an item.
    run_waits: bool,
    /// Receiving threads that sleep, waiting for room in `items`.
    deliver_waits: usize,
}

impl Inflow {
    fn new(depth: usize, max_message: usize, path: Option<PathAllocator>, from: &str) -> Inflow {
        Inflow {
            from: from.to_owned(),
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            publisher: Mutex::new(None),
            path,
            assembly: Mutex::new(None),
            halt: AtomicBool::new(false),
            depth,
            max_message,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publisher(&self) -> std::sync::MutexGuard<'_, Option<Publisher>> {
        self.publisher.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One sample from the network (in zenoh's receiving thread, in order).
    fn take(&self, kind: SampleKind, payload: &ZBytes, attachment: Option<&ZBytes>) {
        if kind == SampleKind::Delete {
            self.deliver(Item::End);
            return;
        }
        let item = match parse_chunk_tag(attachment, &self.from) {
            Tag::Foreign => return,
            Tag::Chunk(total, offset) => {
                if total > self.max_message {
                    return;
                }
                match self.assemble(total, offset, payload) {
                    Some(item) => item,
                    None => return,
                }
            }
            Tag::Whole => {
                if payload.len() > self.max_message {
                    return;
                }
                match self.path.as_ref().and_then(|p| p.alloc(payload.len()).ok()) {
                    Some(mut m) => {
                        copy_payload(payload, 0, |at, s| m.write_at(at, s));
                        Item::Ready(m.freeze())
                    }
                    None => Item::Raw(vec![payload.clone()]),
                }
            }
        };
        self.deliver(item);
    }

    /// Adds a chunk to the message being received: the whole message once this was its
    /// last chunk. A chunk out of place (one before it was lost with a link) drops the
    /// message rather than deliver it wrong.
    fn assemble(&self, total: usize, offset: usize, chunk: &ZBytes) -> Option<Item> {
        let mut a = self.assembly.lock().unwrap_or_else(|e| e.into_inner());
        if offset == 0 {
            let into = match self.path.as_ref().map(|p| p.alloc(total)) {
                Some(Ok(m)) => Ok(m),
                _ => Err(Vec::new()),
            };
            *a = Some(Assembly {
                total,
                next: 0,
                into,
            });
        }
        let fits = a
            .as_ref()
            .is_some_and(|s| s.total == total && s.next == offset && chunk.len() <= total - offset);
        if !fits {
            *a = None;
            return None;
        }
        let s = a.as_mut().expect("checked");
        match &mut s.into {
            Ok(m) => copy_payload(chunk, offset, |at, s| m.write_at(at, s)),
            Err(parts) => parts.push(chunk.clone()),
        }
        s.next += chunk.len();
        if s.next < total {
            return None;
        }
        Some(match a.take().expect("checked").into {
            Ok(m) => Item::Ready(m.freeze()),
            Err(parts) => Item::Raw(parts),
        })
    }

    /// Publishes `item` at once if nothing is ahead of it and it is copied already, or
    /// leaves it to the import's thread; waits only while `depth` items wait there.
    fn deliver(&self, item: Item) {
        let mut q = self.lock();
        loop {
            if self.halt.load(Ordering::Relaxed) || q.failed.is_some() {
                return;
            }
            if matches!(item, Item::End) {
                q.items.push_back(item);
                self.changed.notify_all();
                return;
            }
            if q.open && !q.busy && q.items.is_empty() {
                if let Item::Ready(data) = &item {
                    q.busy = true;
                    drop(q);
                    let r = self.begin(data);
                    let mut q = self.lock();
                    q.busy = false;
                    match r {
                        Ok(None) => {}
                        // Behind it, anything that came meanwhile from another thread.
                        Ok(Some(p)) => q.items.push_front(Item::Begun(p)),
                        Err(e) => q.failed = Some(e),
                    }
                    // The common case, every subscriber took it and nothing came
                    // meanwhile, leaves nothing for anyone: no signal.
                    if !q.items.is_empty() || q.failed.is_some() {
                        self.changed.notify_all();
                    }
                    return;
                }
            }
            if q.items.len() < self.depth {
                q.items.push_back(item);
                if q.run_waits {
                    self.changed.notify_all();
                }
                return;
            }
            if !q.open {
                // Not offered yet, so no local subscriber can have missed these: keep
                // the newest rather than hold up this thread, which must deliver the
                // answer that lets the import offer the service. An end already queued
                // stays: only the oldest message goes.
                if let Some(at) = q.items.iter().position(|i| !matches!(i, Item::End)) {
                    q.items.remove(at);
                    q.items.push_back(item);
                }
                return;
            }
            q.deliver_waits += 1;
            q = self
                .changed
                .wait_timeout(q, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            q.deliver_waits -= 1;
        }
    }

    /// The first pass of publishing `data`: `None` if every subscriber took it, else
    /// the publish whose full queues are still to be waited on.
    fn begin(&self, data: &IoData) -> std::result::Result<Option<ferry::Publishing>, String> {
        let mut p = self.publisher();
        let Some(publisher) = p.as_mut() else {
            return Ok(None);
        };
        let begun = publisher
            .begin_publish(data)
            .map_err(|e| format!("publishing: {e}"))?;
        if begun.waiting() > 0 {
            return Ok(Some(begun));
        }
        let _ = publisher.end_publish(begun);
        Ok(None)
    }

    /// The import's thread's share of `item`, waiting for local subscribers as long as
    /// it must (until `halt`).
    fn publish(&self, item: Item) -> Result<()> {
        let mut p = self.publisher();
        let Some(publisher) = p.as_mut() else {
            return Ok(());
        };
        match item {
            Item::Ready(data) => publish_blocking(publisher, &data, &self.halt),
            Item::Raw(parts) => publish_copy(publisher, &parts, &self.halt),
            Item::Begun(begun) => finish_publish(publisher, begun, &self.halt),
            Item::End => Ok(()),
        }
    }

    /// The service is offered locally: from now on messages go out.
    fn offer(&self, publisher: Publisher) {
        *self.publisher() = Some(publisher);
        self.lock().open = true;
        self.changed.notify_all();
    }

    /// The import's thread: publishes the messages left to it, in order, until the far
    /// end ends the service, publishing fails or `stop` is set.
    fn run(&self, stop: &AtomicBool) -> Result<End> {
        let mut q = self.lock();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(End::Stopped);
            }
            if let Some(e) = q.failed.take() {
                bail!("{e}");
            }
            if q.busy || !q.open || q.items.is_empty() {
                q.run_waits = true;
                q = self
                    .changed
                    .wait_timeout(q, POLL)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                q.run_waits = false;
                continue;
            }
            let item = q.items.pop_front().expect("not empty");
            if matches!(item, Item::End) {
                return Ok(End::Ended);
            }
            q.busy = true;
            drop(q);
            let r = self.publish(item);
            q = self.lock();
            q.busy = false;
            if q.deliver_waits > 0 {
                self.changed.notify_all();
            }
            r?;
        }
    }

    /// Ends the import: nothing waits for local subscribers any more, and the
    /// publisher is withdrawn.
    fn finish(&self) {
        self.halt.store(true, Ordering::Relaxed);
        self.changed.notify_all();
        let publisher = self.publisher().take();
        drop(publisher);
    }
}

fn import_blocking(
    ctx: &Ctx,
    name: &str,
    zid: &str,
    shape: Shape,
    stop: &AtomicBool,
) -> Result<End> {
    let key = data_key(&ctx.scope, name);
    let path = ctx.domain.path(PathConfig::default())?;
    let inflow = Arc::new(Inflow::new(
        shape.depth as usize,
        ctx.max_message,
        Some(path),
        zid,
    ));
    let taker = inflow.clone();
    let sub = ctx
        .session
        .declare_subscriber(&key)
        .allowed_origin(Locality::Remote)
        .callback(move |s| taker.take(s.kind(), s.payload(), s.attachment()))
        .wait()
        .map_err(|e| anyhow!("subscribing to {key}: {e}"))?;
    let result = (|| {
        let far = far_from_config(zid, &far_config(ctx, zid, name)?);
        let publisher = Publisher::offer(&ctx.domain, name, shape.service_config())
            .with_context(|| format!("offering {name} locally"))?;
        publisher.set_bridged_from(&far)?;
        let _using = declare_use(ctx, zid, name)?;
        inflow.offer(publisher);
        say!(ctx, "importing {name} from {zid} ({})", shape.tag());
        let end = inflow
            .run(stop)
            .with_context(|| format!("publishing {name}"))?;
        if matches!(end, End::Ended) {
            say!(ctx, "{name}: the far end ended it");
        }
        Ok(end)
    })();
    inflow.finish();
    drop(sub);
    result
}

/// Copies `parts` (a message, or its chunks in order) into one fbuf of the publisher's
/// path, waiting for room in it, and publishes it: as a loan does, but in steps so
/// that a stuck local subscriber does not keep the bridge from stopping (`halt`).
fn publish_copy(publisher: &mut Publisher, parts: &[ZBytes], halt: &AtomicBool) -> Result<()> {
    let len = parts.iter().map(ZBytes::len).sum();
    let mut m = loop {
        match publisher.path().alloc(len) {
            Ok(m) => break m,
            Err(e) => {
                if !room_for_loan(publisher, len, e, halt)? || halt.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
        }
    };
    let mut at = 0;
    for p in parts {
        copy_payload(p, at, |at, s| m.write_at(at, s));
        at += p.len();
    }
    publish_blocking(publisher, &m.freeze(), halt)
}

/// Publishes `data`, waiting for full queues until `halt`.
fn publish_blocking(publisher: &mut Publisher, data: &IoData, halt: &AtomicBool) -> Result<()> {
    let p = publisher.begin_publish(data)?;
    finish_publish(publisher, p, halt)
}

/// Waits for `p`'s full queues until they took the message or `halt` is set.
fn finish_publish(
    publisher: &mut Publisher,
    mut p: ferry::Publishing,
    halt: &AtomicBool,
) -> Result<()> {
    while p.waiting() > 0 && !halt.load(Ordering::Relaxed) {
        match publisher.wait_publish(&mut p, POLL) {
            Ok(()) | Err(Error::Timeout) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let _ = publisher.end_publish(p);
    Ok(())
}

/// Copies a zenoh payload slice by slice to offset `at` onwards of a destination, each
/// slice through `write(offset, slice)`: a loan's bytes, or an fbuf being filled.
fn copy_payload(payload: &ZBytes, mut at: usize, mut write: impl FnMut(usize, &[u8])) {
    for s in payload.slices() {
        write(at, s);
        at += s.len();
    }
}

/// Waits (while subscribers hold the path's quota) up to a second for room for a loan
/// that was refused with `e`: true to try again, false to drop the message.
fn room_for_loan(
    publisher: &mut Publisher,
    len: usize,
    e: Error,
    stop: &AtomicBool,
) -> Result<bool> {
    match e {
        Error::QuotaExceeded { .. } => {}
        Error::MessageTooLarge { .. } => return Ok(false),
        e => return Err(e.into()),
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        publisher.collect_releases();
        if publisher.path().outstanding() + len <= PathConfig::default().quota {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(true)
}

/// A network payload copied once into an fbuf of `path`.
fn to_iodata(path: &PathAllocator, payload: Option<&ZBytes>) -> Result<IoData> {
    let Some(p) = payload else {
        return Ok(IoData::new());
    };
    let mut m = path.alloc(p.len())?;
    copy_payload(p, 0, |at, s| m.write_at(at, s));
    Ok(m.freeze())
}

fn export_reqresp(ctx: &Ctx, name: &str, shape: Shape, stop: &AtomicBool) -> Result<End> {
    let mut client = Client::open(&ctx.domain, name, Duration::from_secs(1))
        .with_context(|| format!("opening a client of {name}"))?;
    let calls = ctx
        .session
        .declare_queryable(data_key(&ctx.scope, name))
        .allowed_origin(Locality::Remote)
        .with(FifoChannel::new(shape.depth as usize))
        .wait()
        .map_err(|e| anyhow!("declaring the queryable of {name}: {e}"))?;
    let announced = announce_answering(ctx, name, shape)?;
    let mut far_ends = FarEnds::watch(ctx, name)?;
    say!(ctx, "exporting {name} ({})", shape.tag());
    let end = loop {
        if stop.load(Ordering::Relaxed) {
            break End::Stopped;
        }
        if far_ends.update() {
            if let Err(e) = client.set_carried_to(&far_list(&far_ends.far)) {
                say!(ctx, "{name}: recording its far ends: {e}");
            }
        }
        let Ok(Some(q)) = calls.recv_timeout(POLL) else {
            continue;
        };
        let request = to_iodata(&ctx.path, q.payload())?;
        let key = q.key_expr().clone();
        let sent = match client.call(&request, ctx.call_timeout) {
            Ok(r) => q.reply(key, to_zbytes(r)).wait(),
            Err(Error::RequestFailed { status }) => q.reply_err(status.to_string()).wait(),
            Err(Error::Timeout) => q.reply_err(STATUS_NO_ANSWER.to_string()).wait(),
            Err(Error::PeerGone { .. } | Error::Disconnected) => {
                let _ = q.reply_err(STATUS_FAR_SERVER_GONE.to_string()).wait();
                break End::Ended;
            }
            Err(e) => return Err(e).with_context(|| format!("calling {name}")),
        };
        if let Err(e) = sent {
            say!(ctx, "{name}: answering a call: {e}");
        }
    };
    drop(announced);
    say!(ctx, "{name}: export ended");
    Ok(end)
}

fn import_reqresp(
    ctx: &Ctx,
    name: &str,
    zid: &str,
    shape: Shape,
    stop: &AtomicBool,
) -> Result<End> {
    let key = data_key(&ctx.scope, name);
    let far = far_from_config(zid, &far_config(ctx, zid, name)?);
    let mut server = Server::offer(&ctx.domain, name, shape.service_config())
        .with_context(|| format!("offering {name} locally"))?;
    server.set_bridged_from(&far)?;
    let _using = declare_use(ctx, zid, name)?;
    say!(ctx, "importing {name} from {zid} ({})", shape.tag());
    // Requests are answered one at a time, as a local server serves its clients in turn.
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(End::Stopped);
        }
        let req = match server.recv_timeout(POLL) {
            Ok(r) => r,
            Err(Error::Timeout) => continue,
            Err(e) => return Err(e.into()),
        };
        let replies = ctx
            .session
            .get(&key)
            .payload(to_zbytes(req.data.clone()))
            .allowed_destination(Locality::Remote)
            .timeout(ctx.call_timeout)
            .wait()
            .map_err(|e| anyhow!("calling {key}: {e}"))?;
        let answered = match replies.recv() {
            Ok(reply) => match reply.result() {
                Ok(sample) => match to_iodata(server.path(), Some(sample.payload())) {
                    Ok(body) => server.reply(&req, &body),
                    Err(_) => server.fail(&req, STATUS_NO_ANSWER),
                },
                Err(e) => {
                    let status = e
                        .payload()
                        .try_to_string()
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(STATUS_NO_ANSWER);
                    server.fail(&req, status)
                }
            },
            // No reply before the timeout: no far server, or a slow one.
            Err(_) => server.fail(&req, STATUS_NO_ANSWER),
        };
        match answered {
            Ok(()) | Err(Error::PeerGone { .. } | Error::Disconnected | Error::Timeout) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The zid of the far bridge the tests' imports follow.
    const FAR: &str = "0123456789abcdef";

    /// Before the service is offered, a full queue makes room by dropping its oldest
    /// message, never the far end's end of the service queued among them.
    #[test]
    fn an_end_queued_before_the_offer_is_kept() {
        let inflow = Inflow::new(2, 1 << 20, None, FAR);
        let msg = |b: u8| ZBytes::from(vec![b]);
        inflow.take(SampleKind::Put, &msg(1), None);
        inflow.take(SampleKind::Delete, &msg(0), None);
        for b in 2..6 {
            inflow.take(SampleKind::Put, &msg(b), None);
        }
        let q = inflow.lock();
        let kept: Vec<Option<u8>> = q
            .items
            .iter()
            .map(|i| match i {
                Item::Raw(parts) => Some(parts[0].to_bytes()[0]),
                _ => None,
            })
            .collect();
        assert_eq!(kept, [None, Some(5)], "the end was dropped: {kept:?}");
    }

    /// A message of `len` bytes of `k` (its byte at offset `i` is `k + i / 4096`, so
    /// that a chunk out of place shows), whole or in [`chunks`] as the exporting bridge
    /// puts it.
    fn feed(inflow: &Inflow, k: u8, len: usize) {
        let bytes: Vec<u8> = (0..len).map(|i| k.wrapping_add((i / 4096) as u8)).collect();
        if len <= CHUNK {
            inflow.take(SampleKind::Put, &ZBytes::from(bytes), None);
            return;
        }
        for r in chunks(len) {
            let at = r.start;
            inflow.take(
                SampleKind::Put,
                &ZBytes::from(bytes[r].to_vec()),
                Some(&chunk_tag(FAR, len, at)),
            );
        }
    }

    fn check(d: &IoData, k: u8, len: usize) {
        let got = d.to_vec();
        assert_eq!((got.len(), got[0]), (len, k), "message {k}");
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, b)| *b == k.wrapping_add((i / 4096) as u8)),
            "message {k} not byte-identical"
        );
    }

    /// A blocking import keeps the newest messages that come before the service is
    /// offered without holding up the receiving thread; then it copies and publishes
    /// every message, large ones chunk by chunk, in the thread that received it (no
    /// thread of the bridge runs). That thread never waits for a slow local subscriber:
    /// what finds its queue full is left to the import's thread, and the subscriber
    /// gets everything in order, byte-identical.
    #[test]
    fn blocking_import_publishes_where_messages_arrive_and_keeps_order() {
        let name = format!("fz-inflow-{}", std::process::id());
        let _gone = removed_on_drop(&name);
        let group = Group::open(&name).unwrap();
        let (a, b) = (group.join().unwrap(), group.join().unwrap());
        let shape = Shape {
            kind: ServiceKind::PubSub,
            slow: SlowSubscriber::Block,
            depth: 4,
        };
        let publisher = Publisher::offer(&a, "in/flow", shape.service_config()).unwrap();
        let mut sub = Subscriber::open(&b, "in/flow", Duration::from_secs(5)).unwrap();
        publisher
            .wait_for_subscribers(1, Duration::from_secs(5))
            .unwrap();
        let path = a.path(PathConfig::default()).unwrap();
        let inflow = Arc::new(Inflow::new(4, usize::MAX, Some(path), FAR));
        let msg = |k: u8, len: usize| ZBytes::from(vec![k; len]);
        // Before the service is offered, more messages than the queue holds do not hold
        // up the receiving thread (it must deliver the answer the import waits for to
        // offer the service); the newest are kept, in order.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let early = inflow.clone();
        std::thread::spawn(move || {
            for k in 0..10u8 {
                early.take(SampleKind::Put, &msg(200 + k, 10), None);
            }
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the receiving thread was held up before the offer");
        inflow.offer(publisher);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let worker = s.spawn(|| inflow.run(&stop));
            for k in 6..10u8 {
                let d = sub.recv_timeout(Duration::from_secs(5)).unwrap();
                assert_eq!(d.to_vec()[0], 200 + k);
            }
            stop.store(true, Ordering::Relaxed);
            assert!(matches!(worker.join().unwrap(), Ok(End::Stopped)));
        });
        // No import thread now: a small message goes out at once, and so does a large
        // one, assembled from its chunks.
        feed(&inflow, 0, 100);
        check(&sub.recv_timeout(Duration::from_secs(5)).unwrap(), 0, 100);
        feed(&inflow, 1, 5 * CHUNK - 5);
        check(
            &sub.recv_timeout(Duration::from_secs(5)).unwrap(),
            1,
            5 * CHUNK - 5,
        );
        // A chunk lost on the way (a link that broke) drops its message, not the next.
        let len = 3 * CHUNK;
        let rs: Vec<_> = chunks(len).collect();
        for r in [&rs[0], &rs[2]] {
            let tag = chunk_tag(FAR, len, r.start);
            inflow.take(SampleKind::Put, &msg(9, r.len()), Some(&tag));
        }
        feed(&inflow, 2, 2 * CHUNK + 1);
        check(
            &sub.recv_timeout(Duration::from_secs(5)).unwrap(),
            2,
            2 * CHUNK + 1,
        );
        // Nobody receives, no import thread: the subscriber's queue (4) fills, and the
        // receiving thread still returns from every message up to the import's own
        // queue (4 more), large ones among them.
        let sizes = |k: u8| if k % 2 == 0 { 5 * CHUNK + 7 } else { 50 };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                for k in 3..11u8 {
                    feed(&inflow, k, sizes(k));
                }
                let _ = done_tx.send(());
            });
            let waited = done_rx.recv_timeout(Duration::from_secs(10));
            if waited.is_err() {
                // Unblock it before failing, so that the scope can end.
                inflow.finish();
            }
            assert!(
                waited.is_ok(),
                "the receiving thread waited for a slow local subscriber"
            );
        });
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let worker = s.spawn(|| inflow.run(&stop));
            let taker = s.spawn(|| {
                for k in 11..40u8 {
                    feed(&inflow, k, sizes(k));
                }
                inflow.take(SampleKind::Delete, &ZBytes::new(), None);
            });
            for k in 3..40u8 {
                let d = sub.recv_timeout(Duration::from_secs(10)).unwrap();
                check(&d, k, sizes(k));
                // A slow subscriber: the network is held up, nothing is lost.
                std::thread::sleep(Duration::from_millis(2));
            }
            taker.join().unwrap();
            assert!(matches!(worker.join().unwrap(), Ok(End::Ended)));
        });
        // The receiving thread's copies reuse the fbufs the subscriber gave back, warm
        // (mapped and faulted in), rather than carve fresh ones.
        let stats = inflow.path.as_ref().unwrap().stats();
        assert!(stats.cached > stats.allocs / 2, "{stats:?}");
        inflow.finish();
        assert!(matches!(
            sub.recv_timeout(Duration::from_secs(5)),
            Err(Error::PeerGone { .. } | Error::Disconnected)
        ));
    }

    /// A chunked message's chunks cover it exactly, in order, each at most [`CHUNK`].
    #[test]
    fn chunks_cover_the_message() {
        for total in [CHUNK + 1, 2 * CHUNK, (1 << 20) + 3, 64 << 20, 5 * CHUNK - 5] {
            let rs: Vec<_> = chunks(total).collect();
            assert_eq!(rs.first().unwrap().start, 0);
            assert_eq!(rs.last().unwrap().end, total);
            assert!(rs.windows(2).all(|w| w[0].end == w[1].start), "{total}");
            assert!(
                rs.iter().all(|r| r.len() <= CHUNK && !r.is_empty()),
                "{total}"
            );
            assert_eq!(rs.len(), total.div_ceil(CHUNK), "{total}");
        }
        assert_eq!(chunks(1 << 20).count(), 17);
    }

    /// A thread that may use one CPU only does not chunk (nor do the threads it
    /// starts); one that may use several does.
    #[test]
    fn chunks_only_with_more_than_one_cpu() {
        if std::thread::available_parallelism().unwrap().get() > 1 {
            assert!(chunking_helps());
        } else {
            println!("SKIP (in part): this process may use one CPU only");
        }
        std::thread::spawn(|| {
            let first = ferry_measure::sys::allowed_cpus()[0];
            ferry_measure::sys::pin_to(first).unwrap();
            assert!(!chunking_helps());
            let inherited = std::thread::spawn(chunking_helps).join().unwrap();
            assert!(!inherited, "a thread started on one CPU chunked");
        })
        .join()
        .unwrap();
    }

    /// Another host exporting a service of the same name puts to the same key: its
    /// chunks, interleaved with ours, are left out, never assembled into our message.
    #[test]
    fn chunks_of_another_exporter_are_not_assembled_into_ours() {
        let name = format!("fz-foreign-{}", std::process::id());
        let group = Group::open(&name).unwrap();
        let _gone = removed_on_drop(&name);
        let a = group.join().unwrap();
        let inflow = Inflow::new(
            4,
            usize::MAX,
            Some(a.path(PathConfig::default()).unwrap()),
            FAR,
        );
        let len = 3 * CHUNK;
        let ours: Vec<u8> = (0..len)
            .map(|i| 1u8.wrapping_add((i / 4096) as u8))
            .collect();
        for r in chunks(len) {
            let tag = chunk_tag(FAR, len, r.start);
            inflow.take(
                SampleKind::Put,
                &ZBytes::from(ours[r.clone()].to_vec()),
                Some(&tag),
            );
            let tag = chunk_tag("fedcba9876543210", len, r.start);
            inflow.take(
                SampleKind::Put,
                &ZBytes::from(vec![0xee; r.len()]),
                Some(&tag),
            );
        }
        let q = inflow.lock();
        assert_eq!(q.items.len(), 1, "one message, ours");
        match &q.items[0] {
            Item::Ready(d) => check(d, 1, len),
            _ => panic!("our message was not assembled"),
        }
    }

    /// Removes the group file `name` when dropped.
    fn removed_on_drop(name: &str) -> impl Drop {
        struct Gone(String);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(format!("/dev/shm/ferry.{}", self.0));
            }
        }
        Gone(name.to_owned())
    }

    #[test]
    fn far_names_are_clean_and_fit_a_note() {
        assert_eq!(clean_host(" host-a.lan\n"), "host-a.lan");
        assert_eq!(clean_host("a\u{1b}[2J/b*"), "a__2J_b_");
        assert_eq!(clean_host(""), "unknown");
        assert_eq!(far_from_config("z1", "kind=ps host=cam\u{7}"), "cam_ (z1)");
        assert_eq!(far_from_config("z1", "kind=ps"), "unknown (z1)");
        let mut far = std::collections::BTreeMap::new();
        for k in 0..10 {
            far.insert(format!("{k:032x}"), "x".repeat(40));
            let list = far_list(&far);
            assert!(list.len() <= ferry::MAX_FAR, "{list}");
            if k >= 2 {
                assert!(list.ends_with(" more"), "{list}");
            }
        }
    }
}
