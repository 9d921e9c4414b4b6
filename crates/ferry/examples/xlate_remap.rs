//! xlate on ordinary heap and `mmap` memory: the first write of a buffer misses and goes
//! through a bounce buffer, later writes of it hit the registration cache, and when the
//! application unmaps the buffer and maps new bytes at the same address, the next write
//! carries the new bytes (userfaultfd tells the cache about the unmap).
//!
//! ```text
//! cargo run --release -p ferry --example xlate_remap
//! ```

use std::io::{Read, Seek, SeekFrom};

use ferry::uring::xlate::{Xlate, XlateConfig};

fn main() -> ferry::Result<()> {
    let mut x = Xlate::new(XlateConfig::default())?;
    println!("invalidation: {:?}", x.invalidation());
    let path = std::env::temp_dir().join(format!("xlate-remap-{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;

    // A heap buffer, written ten times: one miss, then hits.
    let heap = vec![1u8; 64 * 1024];
    for i in 0..10u64 {
        x.write_at(&file, &heap, i * heap.len() as u64)?;
    }
    let s = x.stats();
    println!(
        "heap buffer, 10 writes: {} misses, {} hits",
        s.misses, s.hits
    );

    // An anonymous mapping: write it, unmap it, map new bytes at the same address.
    let len = 64 * 1024;
    let addr = map(None, len);
    // SAFETY: `addr` is a fresh private mapping of `len` bytes, unmapped only below.
    unsafe { std::ptr::write_bytes(addr, b'A', len) };
    // SAFETY: as above; the slice is not used after the unmap.
    let old = unsafe { std::slice::from_raw_parts(addr, len) };
    x.write_at(&file, old, 0)?; // a miss
    x.write_at(&file, old, 0)?; // a hit
                                // SAFETY: nothing refers to the mapping any more.
    unsafe { libc::munmap(addr.cast(), len) };
    let again = map(Some(addr), len);
    assert_eq!(again, addr, "the kernel gave the same address back");
    // SAFETY: the new mapping at the same address, `len` bytes.
    unsafe { std::ptr::write_bytes(again, b'B', len) };
    // SAFETY: as above.
    let new = unsafe { std::slice::from_raw_parts(again, len) };
    x.write_at(&file, new, 0)?; // the unmap dropped the cache entry: the new bytes go out

    let mut head = [0u8; 4];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut head)?;
    println!(
        "after munmap + mmap at the same address the file holds {:?}",
        head
    );
    assert_eq!(&head, b"BBBB");
    println!("{:?}", x.stats());
    // SAFETY: the example is done with the mapping.
    unsafe { libc::munmap(again.cast(), len) };
    Ok(())
}

/// Maps `len` bytes of private anonymous memory, at `at` if given (`MAP_FIXED_NOREPLACE`).
fn map(at: Option<*mut u8>, len: usize) -> *mut u8 {
    let flags = libc::MAP_PRIVATE
        | libc::MAP_ANONYMOUS
        | if at.is_some() {
            libc::MAP_FIXED_NOREPLACE
        } else {
            0
        };
    // SAFETY: an anonymous mapping that replaces nothing (`MAP_FIXED_NOREPLACE`).
    let p = unsafe {
        libc::mmap(
            at.map_or(std::ptr::null_mut(), |p| p.cast()),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap failed");
    p.cast()
}
