//! Micro benchmarks of ferry's building blocks, in one process (the cross-process
//! experiments are `ferry-bench ...`). Run with `cargo bench -p ferry`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use ferry::{Group, IoData, PathConfig};

/// IoData editing: none of these copy payload; their cost is the fragment list.
fn iodata(c: &mut Criterion) {
    let parts: Vec<IoData> = (0..16)
        .map(|i| IoData::from_vec(vec![i as u8; 4096]))
        .collect();
    let data = IoData::concat_all(parts);
    c.bench_function("iodata/clone (16 fragments)", |b| {
        b.iter(|| black_box(data.clone()))
    });
    c.bench_function("iodata/slice middle (16 fragments)", |b| {
        b.iter(|| black_box(data.slice(1000..60_000)))
    });
    c.bench_function("iodata/concat two (16 + 16 fragments)", |b| {
        b.iter(|| black_box(data.concat(&data)))
    });
    c.bench_function("iodata/units of 1000 bytes over 64 KiB", |b| {
        b.iter(|| data.units(1000).map(|u| u.len()).sum::<usize>())
    });
}

/// One alloc, send, receive and release round between two domains of this process:
/// the software cost of a hand-over, without cross-core cache traffic.
fn round_trip(c: &mut Criterion) {
    let g = Group::open(&format!("bench-micro-{}", std::process::id())).unwrap();
    let a = g.join().unwrap();
    let b = g.join().unwrap();
    let to = b.id();
    let a2 = a.clone();
    let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    let mut rx = b.accept(Duration::from_secs(5)).unwrap();
    let tx = connecting.join().unwrap().unwrap();
    let path = a.path(PathConfig::default()).unwrap();
    c.bench_function("channel/alloc+send+recv+release 4 KiB", |bench| {
        bench.iter(|| {
            let mut m = path.alloc(4096).unwrap();
            m.write_at(0, b"x");
            tx.try_send(&m.freeze()).unwrap();
            black_box(rx.try_recv().unwrap().unwrap());
        })
    });
}

criterion_group!(benches, iodata, round_trip);
criterion_main!(benches);
