//! Existing consumers reading a fragmented `IoData` in place, without first copying it
//! into one contiguous buffer.
//!
//! Run with `cargo run -p ferry --example iodata_consumers`.

use std::borrow::Cow;
use std::io::Read;

use bytes::{Buf, BufMut};
use ferry::{IoData, IoDataMut};

/// Splits `bytes` into separate heap vectors of `n` bytes, as a receiver might get a
/// message spread over several buffers.
fn fragmented(bytes: &[u8], n: usize) -> IoData {
    IoData::concat_all(bytes.chunks(n).map(|c| IoData::from_vec(c.to_vec())))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. serde_json parses straight from the fragments through `io::Read`.
    let doc = br#"{"service":"ferry","version":3,"lots":[{"slot":1,"bytes":65536},{"slot":2,"bytes":131072}]}"#;
    let json = fragmented(doc, 11);
    println!("JSON document: {json:?}");
    let v: serde_json::Value = serde_json::from_reader(json.cursor())?;
    let total: u64 = v["lots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["bytes"].as_u64().unwrap())
        .sum();
    println!(
        "  service={} version={} lot bytes={total}",
        v["service"], v["version"]
    );

    // 2. A binary header decoded with `bytes::Buf`, whose fields straddle fragments.
    let mut header = IoDataMut::with_capacity_heap(16);
    header.put_u32(0xFE77_0001); // magic + version
    header.put_u16(3); // flags
    header.put_u16(0x0a0b);
    header.put_u64_le(1 << 40);
    let header = header.freeze();
    // Splitting and rejoining shares memory; adjacent windows of one buffer merge again.
    let (a, rest) = header.split_at(3);
    let (b, c) = rest.split_at(6);
    println!(
        "split in three and rejoined: {:?}",
        IoData::concat_all([a, b, c])
    );
    // As it might arrive: spread over 5-byte buffers, so every field straddles a boundary.
    let mut wire = fragmented(&header.to_vec(), 5);
    println!("binary header: {wire:?}");
    println!(
        "  magic={:#010x} flags={} port={:#06x} offset={}",
        wire.get_u32(),
        wire.get_u16(),
        wire.get_u16(),
        wire.get_u64_le()
    );

    // 3. Fixed-size records: borrowed in place unless one straddles a fragment boundary.
    let records = fragmented(&(0u8..40).collect::<Vec<_>>(), 12);
    let mut units = records.units(8);
    let kinds: Vec<&str> = units
        .by_ref()
        .map(|u| match u {
            Cow::Borrowed(_) => "borrowed",
            Cow::Owned(_) => "copied",
        })
        .collect();
    println!("8-byte records over 12-byte fragments: {kinds:?}");
    println!(
        "  {} borrowed, {} copied ({} bytes)",
        units.borrowed_units(),
        units.copied_units(),
        units.copied_bytes()
    );

    // 4. Plain `io::Read` consumers (here `read_to_string`) consume the IoData itself.
    let mut text = String::new();
    fragmented(b"fbufs: zero-copy across protection domains", 5).read_to_string(&mut text)?;
    println!("read_to_string: {text:?}");
    Ok(())
}
