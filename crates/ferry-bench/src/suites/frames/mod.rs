//! `ferry-bench frames`: a 4K video frame pipeline of three processes (camera, filter
//! stage, display), 8 MiB frames paced at 60 frames per second, three ways:
//!
//! - **ferry memfd per frame**: the camera writes each frame into a memfd of a pool of
//!   [`POOL`] (as a V4L2 or GPU exporter hands out a ring of dma-bufs) and publishes a
//!   16-byte message carrying that memfd as cargo ([`Publisher::publish_with_fds`]); the
//!   stage maps it, reads the frame and publishes the same memfd on; the display maps it
//!   and reads it. The queues' depth ([`DEPTH`]) bounds the frames in flight well below
//!   the pool, so a memfd is rewritten only after both readers are done with it.
//! - **ferry bytes (loan)**: the camera writes each frame into a publisher loan
//!   ([`Publisher::loan`]); the stage reads it and publishes the same `IoData` on (no
//!   copy); the display reads it.
//! - **iceoryx2** 0.10: the camera writes each frame into a loaned sample; the stage reads
//!   it and, since a received sample cannot be sent on, copies it into a sample of its
//!   own publisher; the display reads it. Stage and display poll their subscriber with a
//!   100 µs sleep between empty polls (ferry's receivers sleep in the kernel instead).
//!
//! Every frame is written whole by the camera and read whole (every 8-byte word) by the
//! stage and by the display. The camera stamps each frame with its capture time; the
//! display reports the latency (capture to read done) of every frame. Measured per
//! system: frames per second achieved (frames displayed over the time from the first
//! capture to the last frame displayed), latency median and p99, and CPU time per frame
//! of each process (`/proc/self/stat`, clock ticks: coarse over a short run).
//!
//! The processes are `ferry-bench __frames stage|display SYSTEM GROUP FRAMES`, with the
//! camera in this process; queues of [`DEPTH`], blocking when full, in both systems.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ferry::{Group, Publisher, ServiceConfig, SlowSubscriber, Subscriber};

use crate::harness::chain::touch::read_all;
use crate::harness::ctx::BenchCtx;
use crate::harness::output::{BenchOutput, Table};
use crate::harness::stats::median;
use crate::harness::BenchDef;
use crate::sys::now_ns;

pub const BENCH: BenchDef = BenchDef {
    name: "frames",
    about: "a 4K video frame pipeline (camera, stage, display processes; 8 MiB frames at 60 fps): a memfd per frame vs the bytes through ferry vs iceoryx2",
    run,
};

/// One frame: 3840 x 2160, 8 bits per channel, one byte short of 4 per pixel, rounded
/// up to 8 MiB.
pub const FRAME: usize = 8 << 20;
/// Target rate.
pub const FPS: f64 = 60.0;
/// Each queue's depth.
pub const DEPTH: u32 = 2;
/// The camera's memfds.
pub const POOL: usize = 16;
const HEADER: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Memfd,
    Bytes,
    Ice,
}

const SYSTEMS: [System; 3] = [System::Memfd, System::Bytes, System::Ice];

impl System {
    fn arg(self) -> &'static str {
        match self {
            System::Memfd => "memfd",
            System::Bytes => "bytes",
            System::Ice => "ice",
        }
    }
    fn name(self) -> &'static str {
        match self {
            System::Memfd => "ferry memfd per frame",
            System::Bytes => "ferry bytes (loan)",
            System::Ice => "iceoryx2",
        }
    }
    fn parse(s: &str) -> Result<System> {
        SYSTEMS
            .into_iter()
            .find(|x| x.arg() == s)
            .ok_or_else(|| anyhow!("unknown system {s}"))
    }
}

fn header(b: &mut [u8], seq: u64, t: u64) {
    b[0..8].copy_from_slice(&seq.to_ne_bytes());
    b[8..16].copy_from_slice(&t.to_ne_bytes());
}

fn read_header(b: &[u8]) -> (u64, u64) {
    let w = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    (w(0), w(8))
}

/// This process's CPU time so far (user + system), seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    f.iter().sum::<u64>() as f64 / ticks
}

/// A read-only mapping of a frame's memfd, unmapped on drop.
struct Mapped {
    ptr: *mut std::ffi::c_void,
}

impl Mapped {
    fn of(fd: BorrowedFd<'_>) -> Result<Mapped> {
        // SAFETY: a fresh shared read-only mapping of FRAME bytes of a memfd at least
        // that long (the camera's); nothing else is mapped there.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                FRAME,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        Ok(Mapped { ptr })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: FRAME readable bytes, mapped for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), FRAME) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping of FRAME bytes, no slice of it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr, FRAME) };
    }
}

fn service_config() -> ServiceConfig {
    ServiceConfig {
        depth: DEPTH,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    }
}

const T: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- iceoryx2

mod ice {
    use std::mem::MaybeUninit;

    use anyhow::{anyhow, Result};
    use iceoryx2::port::publisher::Publisher;
    use iceoryx2::port::subscriber::Subscriber;
    use iceoryx2::prelude::*;
    use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSub;

    pub struct Ends {
        pub node: Node<ipc::Service>,
    }

    pub type Pub = (
        Publisher<ipc::Service, [u8], ()>,
        PubSub<ipc::Service, [u8], ()>,
    );
    pub type Sub = (
        Subscriber<ipc::Service, [u8], ()>,
        PubSub<ipc::Service, [u8], ()>,
    );

    impl Ends {
        pub fn new() -> Result<Ends> {
            set_log_level(LogLevel::Error);
            Ok(Ends {
                node: NodeBuilder::new()
                    .create::<ipc::Service>()
                    .map_err(|e| anyhow!("iceoryx2 node: {e:?}"))?,
            })
        }

        fn service(&self, name: &str) -> Result<PubSub<ipc::Service, [u8], ()>> {
            let name: ServiceName = name
                .try_into()
                .map_err(|e| anyhow!("iceoryx2 service name: {e:?}"))?;
            self.node
                .service_builder(&name)
                .publish_subscribe::<[u8]>()
                .max_publishers(1)
                .max_subscribers(1)
                .history_size(0)
                .subscriber_max_buffer_size(super::DEPTH as usize)
                .subscriber_max_borrowed_samples(1)
                .enable_safe_overflow(false)
                .open_or_create()
                .map_err(|e| anyhow!("iceoryx2 service: {e:?}"))
        }

        pub fn publisher(&self, name: &str) -> Result<Pub> {
            let s = self.service(name)?;
            let p = s
                .publisher_builder()
                .initial_max_slice_len(super::FRAME)
                .allocation_strategy(AllocationStrategy::Static)
                .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
                .max_loaned_samples(1)
                .create()
                .map_err(|e| anyhow!("iceoryx2 publisher: {e:?}"))?;
            Ok((p, s))
        }

        pub fn subscriber(&self, name: &str) -> Result<Sub> {
            let s = self.service(name)?;
            let sub = s
                .subscriber_builder()
                .buffer_size(super::DEPTH as usize)
                .create()
                .map_err(|e| anyhow!("iceoryx2 subscriber: {e:?}"))?;
            Ok((sub, s))
        }
    }

    /// Loans a frame, lets `write` fill it, sends it.
    pub fn send(p: &Pub, write: impl FnOnce(&mut [u8])) -> Result<()> {
        let mut s =
            p.0.loan_slice_uninit(super::FRAME)
                .map_err(|e| anyhow!("iceoryx2 loan: {e:?}"))?;
        let raw = s.payload_mut();
        // SAFETY: shared memory every byte of which holds a value (zero-filled at first
        // touch or written by earlier samples); `MaybeUninit<u8>` and `u8` have the same
        // layout.
        let bytes = unsafe { &mut *(raw as *mut [MaybeUninit<u8>] as *mut [u8]) };
        write(bytes);
        // SAFETY: as above.
        let s = unsafe { s.assume_init() };
        s.send().map_err(|e| anyhow!("iceoryx2 send: {e:?}"))?;
        Ok(())
    }
}

// ---------------------------------------------------------------- the stage and display

/// `ferry-bench __frames ROLE SYSTEM GROUP FRAMES`.
pub fn worker_main(args: &[String]) -> Result<()> {
    let [role, sys, group, frames] = args else {
        bail!("usage: __frames stage|display SYSTEM GROUP FRAMES");
    };
    let sys = System::parse(sys)?;
    let frames: u64 = frames.parse()?;
    let stage = role == "stage";
    let (from, to) = (format!("{group}-cam"), format!("{group}-stage"));
    let cpu0 = cpu_seconds();
    let mut lat = Vec::new();
    let mut got = 0u64;
    let mut last = 0u64;
    let mut sum = 0u64;
    if sys == System::Ice {
        let ends = ice::Ends::new()?;
        let sub = ends.subscriber(if stage { &from } else { &to })?;
        let publ = if stage {
            Some(ends.publisher(&to)?)
        } else {
            None
        };
        println!("ready");
        let deadline = Instant::now() + T;
        while got < frames && Instant::now() < deadline {
            let Some(s) = sub
                .0
                .receive()
                .map_err(|e| anyhow!("iceoryx2 receive: {e:?}"))?
            else {
                std::thread::sleep(Duration::from_micros(100));
                continue;
            };
            let b = s.payload();
            sum = sum.wrapping_add(read_all(b));
            let (_, t) = read_header(b);
            if let Some(p) = &publ {
                ice::send(p, |out| out.copy_from_slice(b))?;
            } else {
                last = now_ns();
                lat.push((last - t) as f64 / 1e3);
            }
            got += 1;
        }
    } else {
        let g = Group::open(group)?;
        let d = g.join()?;
        let mut sub = Subscriber::open(&d, if stage { &from } else { &to }, T)?;
        let mut publ = if stage {
            Some(Publisher::offer(&d, &to, service_config())?)
        } else {
            None
        };
        println!("ready");
        if let Some(p) = &publ {
            p.wait_for_subscribers(1, T)?;
        }
        while got < frames {
            let (data, fds) = match sub.recv_with_fds_timeout(T) {
                Ok(x) => x,
                Err(ferry::Error::Timeout) => break,
                Err(e) => return Err(e.into()),
            };
            let mut hdr = [0u8; HEADER];
            data.copy_range_to_slice(0..HEADER, &mut hdr);
            let (_, t) = read_header(&hdr);
            if sys == System::Memfd {
                let fd = fds.get(0).context("a frame without its memfd")?;
                let m = Mapped::of(fd)?;
                sum = sum.wrapping_add(read_all(m.bytes()));
                drop(m);
                if let Some(p) = &mut publ {
                    p.publish_with_fds(&data, &[fd])?;
                }
            } else {
                for f in data.fragments() {
                    sum = sum.wrapping_add(read_all(f.as_slice()));
                }
                if let Some(p) = &mut publ {
                    p.publish(&data)?;
                }
            }
            if publ.is_none() {
                last = now_ns();
                lat.push((last - t) as f64 / 1e3);
            }
            got += 1;
        }
        if let Some(p) = &mut publ {
            // The display takes each frame's memfd from this process (`pidfd_getfd`):
            // stay until it has left, or its last frames' descriptors are gone with us.
            let until = Instant::now() + T;
            while p.subscriber_count() > 0 && Instant::now() < until {
                p.collect_releases();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    let p99 = lat
        .get(((lat.len() as f64 * 0.99) as usize).min(lat.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    println!(
        "done {got} {last} {:.1} {p99:.1} {:.4} {}",
        if lat.is_empty() { 0.0 } else { median(&lat) },
        cpu_seconds() - cpu0,
        sum & 1
    );
    Ok(())
}

// ---------------------------------------------------------------- the camera

struct Role {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Role {
    fn spawn(role: &str, sys: System, group: &str, frames: u64) -> Result<Role> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["__frames", role, sys.arg(), group, &frames.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let out = BufReader::new(child.stdout.take().context("stdout")?);
        let mut r = Role { child, out };
        let l = r.line()?;
        if l != "ready" {
            bail!("{role}: {l}");
        }
        Ok(r)
    }

    fn line(&mut self) -> Result<String> {
        let mut s = String::new();
        self.out.read_line(&mut s)?;
        Ok(s.trim().to_owned())
    }

    /// The `done` line's numbers.
    fn done(mut self) -> Result<Vec<f64>> {
        let l = self.line()?;
        let _ = self.child.wait();
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.first() != Some(&"done") {
            bail!("worker said {l:?}");
        }
        Ok(w[1..].iter().filter_map(|x| x.parse().ok()).collect())
    }
}

struct Point {
    sys: System,
    frames: u64,
    displayed: u64,
    fps: f64,
    lat_median: f64,
    lat_p99: f64,
    /// CPU ms per frame: camera, stage, display.
    cpu: [f64; 3],
}

fn pace(start: Instant, k: u64) {
    let due = start + Duration::from_secs_f64(k as f64 / FPS);
    if let Some(d) = due.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

fn one(sys: System, frames: u64) -> Result<Point> {
    let group = format!("bench-frames-{}-{}", std::process::id(), sys.arg());
    let cpu0 = cpu_seconds();
    let mut first = 0u64;
    let (stage, display);
    if sys == System::Ice {
        let ends = ice::Ends::new()?;
        let cam = ends.publisher(&format!("{group}-cam"))?;
        stage = Role::spawn("stage", sys, &group, frames)?;
        display = Role::spawn("display", sys, &group, frames)?;
        // Subscribers connect as the publisher next looks.
        std::thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        for k in 0..frames {
            pace(start, k);
            let t = now_ns();
            if k == 0 {
                first = t;
            }
            ice::send(&cam, |b| {
                b.fill(k as u8);
                header(b, k, t);
            })?;
        }
    } else {
        let g = Group::open(&group)?;
        let d = g.join()?;
        let mut cam = Publisher::offer(&d, &format!("{group}-cam"), service_config())?;
        stage = Role::spawn("stage", sys, &group, frames)?;
        display = Role::spawn("display", sys, &group, frames)?;
        cam.wait_for_subscribers(1, T)?;
        let pool = if sys == System::Memfd {
            (0..POOL)
                .map(|_| -> Result<(OwnedFd, *mut u8)> {
                    let fd = rustix::fs::memfd_create("frame", rustix::fs::MemfdFlags::CLOEXEC)?;
                    rustix::fs::ftruncate(&fd, FRAME as u64)?;
                    // SAFETY: a fresh shared writable mapping of the whole memfd, kept for
                    // the run (unmapped at exit).
                    let p = unsafe {
                        rustix::mm::mmap(
                            std::ptr::null_mut(),
                            FRAME,
                            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                            rustix::mm::MapFlags::SHARED,
                            &fd,
                            0,
                        )
                    }?;
                    Ok((fd, p.cast::<u8>()))
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let meta_path = d.path(ferry::PathConfig::default())?;
        let start = Instant::now();
        for k in 0..frames {
            pace(start, k);
            let t = now_ns();
            if k == 0 {
                first = t;
            }
            if sys == System::Memfd {
                let (fd, p) = &pool[k as usize % POOL];
                // SAFETY: our own mapping of FRAME bytes; the queues' depth keeps the
                // readers of this memfd's last frame done with it (see the module docs).
                let b = unsafe { std::slice::from_raw_parts_mut(*p, FRAME) };
                b.fill(k as u8);
                header(b, k, t);
                let mut m = meta_path.alloc(HEADER)?;
                let mut h = [0u8; HEADER];
                header(&mut h, k, t);
                m.write_at(0, &h);
                cam.publish_with_fds(&m.freeze(), &[fd.as_fd()])?;
            } else {
                let mut loan = cam.loan(FRAME)?;
                let b = loan.as_mut_slice();
                b.fill(k as u8);
                header(b, k, t);
                loan.send()?;
            }
        }
        for (_, p) in &pool {
            // SAFETY: the mapping made above; no slice of it is alive.
            let _ = unsafe { rustix::mm::munmap(p.cast(), FRAME) };
        }
        drop(pool);
    }
    let cam_cpu = cpu_seconds() - cpu0;
    let s = stage.done()?;
    let dsp = display.done()?;
    let displayed = dsp[0] as u64;
    let last = dsp[1];
    let secs = (last - first as f64) / 1e9;
    let per = |c: f64| c * 1e3 / frames as f64;
    Ok(Point {
        sys,
        frames,
        displayed,
        fps: if secs > 0.0 {
            displayed as f64 / secs
        } else {
            0.0
        },
        lat_median: dsp[2],
        lat_p99: dsp[3],
        cpu: [per(cam_cpu), per(s[4]), per(dsp[4])],
    })
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let frames = ctx.pick(120, 600);
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let mut points = Vec::new();
    for sys in SYSTEMS {
        ctx.progress
            .phase(&format!("frames: {} ({frames} frames)", sys.name()));
        points.push(one(sys, frames).with_context(|| sys.name())?);
    }
    let mut t = Table::new(&[
        "system",
        "frames displayed",
        "frames/s (target 60)",
        "latency median (µs)",
        "latency p99 (µs)",
        "CPU ms/frame camera",
        "stage",
        "display",
    ]);
    for p in &points {
        t.row(vec![
            p.sys.name().into(),
            format!("{}/{}", p.displayed, p.frames),
            format!("{:.1}", p.fps),
            format!("{:.0}", p.lat_median),
            format!("{:.0}", p.lat_p99),
            format!("{:.2}", p.cpu[0]),
            format!("{:.2}", p.cpu[1]),
            format!("{:.2}", p.cpu[2]),
        ]);
    }
    let markdown = format!(
        "## frames: a 4K video pipeline, 8 MiB frames at 60 fps, camera → stage → display\n\n\
         {frames} frames per system; each frame written whole by the camera and read whole by \
         the stage and the display; queues of {DEPTH}, blocking. Load average at the start: {load}.\n\n{}\n\
         The memfd system moves a 16-byte message and the frame's memfd as cargo; the stage and \
         the display map each memfd they get (mmap, page faults, munmap per frame). ferry's \
         bytes system forwards the camera's pages at the stage without a copy; iceoryx2's stage \
         copies each frame into its own sample. CPU times come from clock ticks (10 ms) over the \
         run, divided by its frames.\n",
        t.render()
    );
    Ok(BenchOutput {
        records: Vec::new(),
        markdown,
        plots: Vec::new(),
    })
}
