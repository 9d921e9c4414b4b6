//! Unit tests of IoData and its companions (Miri runs them: heap memory only).

use super::*;
use std::borrow::Cow;
use std::io::{BufRead, Read, Write};

use bytes::BufMut;

use crate::segment::LotSpan;

fn n(big: usize, small: usize) -> usize {
    if cfg!(miri) {
        small
    } else {
        big
    }
}

/// Bytes 0..len (mod 251) split into pieces of the given sizes, each its own vector.
fn pieces(sizes: &[usize]) -> (IoData, Vec<u8>) {
    let total: usize = sizes.iter().sum();
    let model: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    let mut at = 0;
    let parts = sizes.iter().map(|&s| {
        let p = IoData::from_vec(model[at..at + s].to_vec());
        at += s;
        p
    });
    (IoData::concat_all(parts.collect::<Vec<_>>()), model)
}

#[test]
fn types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<IoData>();
    check::<IoDataMut>();
    check::<Fragment>();
    check::<IoDataReader<'_>>();
    check::<Units<'_>>();
}

#[test]
fn empty_has_no_fragments() {
    let e = IoData::new();
    assert!(e.is_empty());
    assert_eq!(e.num_fragments(), 0);
    assert_eq!(e.chunk(), &[] as &[u8]);
    assert_eq!(e, IoData::from_vec(Vec::new()));
    assert_eq!(IoData::from_vec(Vec::new()).num_fragments(), 0);
    assert_eq!(format!("{e:?}"), "IoData { len: 0, fragments: 0 }");
}

#[test]
fn from_vec_does_not_copy() {
    let v = vec![1u8, 2, 3, 4];
    let p = v.as_ptr();
    let d = IoData::from_vec(v);
    assert_eq!(d.fragments()[0].as_slice().as_ptr(), p);
    assert!(d.fragments()[0].lot_span().is_none());
    assert_eq!(d.fragments()[0].offset(), 0);
    assert!(d.eq_bytes(&[1, 2, 3, 4]));
}

#[test]
fn slice_split_concat_share_memory() {
    let (d, model) = pieces(&[3, 5, 7]);
    assert_eq!(d.num_fragments(), 3);
    for a in 0..=model.len() {
        for b in a..=model.len() {
            let s = d.slice(a..b);
            assert!(s.eq_bytes(&model[a..b]), "{a}..{b}");
            assert!(s.fragments().iter().all(|f| !f.is_empty()));
        }
        let (x, y) = d.split_at(a);
        assert_eq!(x.concat(&y), d);
        assert!(x.eq_bytes(&model[..a]) && y.eq_bytes(&model[a..]));
    }
    // A window inside the middle fragment points into it.
    let mid = d.slice(4..6);
    assert_eq!(mid.num_fragments(), 1);
    assert_eq!(mid.fragments()[0].offset(), 1);
    assert_eq!(
        mid.fragments()[0].as_slice().as_ptr(),
        d.fragments()[1].as_slice()[1..].as_ptr()
    );
}

#[test]
fn adjacent_windows_coalesce() {
    let (d, _) = pieces(&[10]);
    let (a, b) = d.split_at(4);
    let back = a.concat(&b);
    assert_eq!(back.num_fragments(), 1);
    assert_eq!(back, d);
}

#[test]
fn out_of_range() {
    let (d, _) = pieces(&[2, 2]);
    assert!(d.try_slice(0..5).is_none());
    assert!(d.try_slice(std::ops::Range { start: 3, end: 2 }).is_none());
    assert!(d.try_slice(..=4).is_none());
    assert!(d.try_slice(4..).unwrap().is_empty());
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.slice(1..9))).is_err());
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.split_at(5))).is_err());
}

#[test]
fn split_to_split_off_truncate_append() {
    let (mut d, model) = pieces(&[3, 4, 5]);
    let shared = d.clone();
    let front = d.split_to(5);
    assert!(front.eq_bytes(&model[..5]));
    assert!(d.eq_bytes(&model[5..]));
    let back = d.split_off(3);
    assert!(d.eq_bytes(&model[5..8]));
    assert!(back.eq_bytes(&model[8..]));
    d.append(back);
    assert!(d.eq_bytes(&model[5..]));
    d.truncate(100);
    d.truncate(2);
    assert!(d.eq_bytes(&model[5..7]));
    // The clone taken first is unaffected.
    assert!(shared.eq_bytes(&model));
    let mut e = IoData::new();
    e.append(shared.clone());
    e.append(shared.clone());
    assert_eq!(e.len(), 2 * model.len());
    assert_eq!(IoData::from_iter([front, shared.slice(5..)]), shared);
}

#[test]
fn clone_is_shared_and_advance_copies_only_the_list() {
    let (d, model) = pieces(&[4, 4, 4]);
    let mut c = d.clone();
    let (Frags::Many(a), Frags::Many(b)) = (&d.frags, &c.frags) else {
        panic!("three fragments make a shared list")
    };
    assert!(Arc::ptr_eq(a, b));
    c.advance(6);
    assert!(c.eq_bytes(&model[6..]));
    assert!(d.eq_bytes(&model));
    assert_eq!(
        c.fragments()[0].as_slice().as_ptr(),
        d.fragments()[1].as_slice()[2..].as_ptr()
    );
    // Now unique: advancing again works in place and releases consumed segments.
    let seg0 = Arc::clone(c.fragments()[0].segment());
    let before = Arc::strong_count(&seg0);
    c.advance(2);
    assert_eq!(Arc::strong_count(&seg0), before - 1);
}

#[test]
fn buf_reads_across_fragments() {
    let mut d = IoData::concat_all([
        IoData::from_vec(vec![0x12, 0x34]),
        IoData::from_vec(vec![0x56, 0x78, 0xaa]),
        IoData::from_vec(vec![0xbb, 1, 2, 3, 4, 5]),
    ]);
    assert_eq!(d.chunk(), &[0x12, 0x34]);
    let mut slots = [IoSlice::new(&[]); 8];
    assert_eq!(d.chunks_vectored(&mut slots), 3);
    assert_eq!(&*slots[1], &[0x56, 0x78, 0xaa]);
    assert_eq!(d.get_u32(), 0x1234_5678);
    assert_eq!(d.get_u16(), 0xaabb);
    let b = d.copy_to_bytes(2);
    assert_eq!(&b[..], &[1, 2]);
    assert_eq!(d.remaining(), 3);
    let mut r = d.cursor();
    assert_eq!(r.get_u8(), 3);
    assert_eq!(d.remaining(), 3);
    let mut rest = Vec::new();
    d.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, [3, 4, 5]);
    assert!(d.is_empty());
}

#[test]
fn copy_to_bytes_is_zero_copy_within_a_fragment() {
    let (mut d, model) = pieces(&[8, 8]);
    let p = d.fragments()[0].as_slice().as_ptr();
    let b = d.copy_to_bytes(6);
    assert_eq!(b.as_ptr(), p);
    assert_eq!(&b[..], &model[..6]);
    let c = d.copy_to_bytes(4); // straddles: copied
    assert_eq!(&c[..], &model[6..10]);
    drop(d);
    assert_eq!(&b[..], &model[..6]); // `b` keeps its segment alive
}

#[test]
fn read_and_bufread() {
    let (mut d, model) = pieces(&[3, 1, 6]);
    let mut buf = [0u8; 5];
    assert_eq!(d.read(&mut buf).unwrap(), 5);
    assert_eq!(buf, model[..5]);
    assert_eq!(d.fill_buf().unwrap(), &model[5..10]);
    BufRead::consume(&mut d, 2);
    let mut rest = Vec::new();
    d.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, model[7..]);
    assert_eq!(d.read(&mut buf).unwrap(), 0);
}

#[test]
fn reader_does_not_consume() {
    let (d, model) = pieces(&[2, 3, 4]);
    let mut r = d.cursor();
    let mut v = Vec::new();
    r.read_to_end(&mut v).unwrap();
    assert_eq!(v, model);
    assert_eq!(d.len(), 9);
    let mut r = d.cursor();
    r.advance(3);
    assert_eq!(r.fill_buf().unwrap(), &model[3..5]);
    let mut slots = [IoSlice::new(&[]); 4];
    assert_eq!(r.chunks_vectored(&mut slots), 2);
    assert_eq!(&*slots[0], &model[3..5]);
    let mut lines = IoData::concat_all([
        IoData::from_vec(b"ab\nc".to_vec()),
        IoData::from_vec(b"d\n".to_vec()),
    ])
    .cursor()
    .lines()
    .map(|l| l.unwrap())
    .collect::<Vec<_>>();
    lines.reverse();
    assert_eq!(lines, ["cd", "ab"]);
}

#[test]
fn units_borrow_inside_fragments() {
    let (d, model) = pieces(&[8, 6, 7]);
    let mut u = d.units(4);
    assert_eq!(u.len(), 6);
    let got: Vec<Cow<'_, [u8]>> = u.by_ref().collect();
    for (i, unit) in got.iter().enumerate() {
        // Only bytes 12..16 straddle (fragment 1 is 8..14).
        assert_eq!(matches!(unit, Cow::Borrowed(_)), i != 3, "unit {i}");
    }
    assert_eq!(got[5].len(), 1);
    assert_eq!(u.borrowed_units(), 5);
    assert_eq!(u.copied_units(), 1);
    assert_eq!(u.copied_bytes(), 4);
    assert_eq!(got.concat(), model);
    // Borrowed units point into the fragments, not into copies.
    assert_eq!(got[2].as_ptr(), d.fragments()[1].as_slice().as_ptr());
    for size in 1..=n(23, 7) {
        assert_eq!(
            d.units(size)
                .flat_map(|c| c.into_owned())
                .collect::<Vec<_>>(),
            model
        );
    }
}

#[test]
fn mutate_writes_new_memory() {
    let (d, model) = pieces(&[5, 6]);
    let heap = |len| Ok(IoDataMut::with_capacity_heap(len));
    let up = d
        .mutate(heap, |src, out| {
            let mut r = src.cursor();
            let mut tmp = vec![0; src.len()];
            r.read_exact(&mut tmp).unwrap();
            tmp.iter_mut().for_each(|b| *b = b.wrapping_add(1));
            out.fill_from(&tmp);
            out.truncate(10);
            Ok(())
        })
        .unwrap();
    let want: Vec<u8> = model[..10].iter().map(|b| b.wrapping_add(1)).collect();
    assert!(up.eq_bytes(&want));
    assert!(d.eq_bytes(&model));

    // Pairs: a target split into two segments of different sizes than the source.
    let two = |len: usize| {
        IoDataMut::from_segments(
            vec![
                Segment::from_vec(vec![0; 3]),
                Segment::from_vec(vec![0; len]),
            ],
            len,
        )
    };
    let mut calls = 0;
    let x = d
        .mutate_pairs(two, |s, t| {
            calls += 1;
            assert_eq!(s.len(), t.len());
            for (a, b) in s.iter().zip(t) {
                *b = a ^ 0xff;
            }
        })
        .unwrap();
    assert_eq!(calls, 3); // [0,3) [3,5) [5,11)
    assert_eq!(
        x.to_vec(),
        model.iter().map(|b| b ^ 0xff).collect::<Vec<_>>()
    );
    assert_eq!(x.num_fragments(), 2);

    let short = |_| Ok(IoDataMut::with_capacity_heap(1));
    assert!(matches!(
        d.mutate(short, |_, _| Ok(())),
        Err(Error::InvalidArgument(_))
    ));
    let failing = d.mutate(heap, |_, _| Err(Error::Timeout));
    assert!(matches!(failing, Err(Error::Timeout)));
}

#[test]
fn iodatamut_write_paths() {
    let segs = vec![
        Segment::from_vec(vec![0; 2]),
        Segment::from_vec(vec![]),
        Segment::from_vec(vec![0; 5]),
    ];
    let mut m = IoDataMut::from_segments(segs, 6).unwrap();
    assert_eq!(
        m.fragments_mut().map(|f| f.len()).collect::<Vec<_>>(),
        [2, 4]
    );
    m.put_u8(1);
    m.put_u16(0x0203);
    assert_eq!(m.position(), 3);
    assert_eq!(m.write(&[4, 5, 6, 7]).unwrap(), 3);
    assert_eq!(m.write(&[8]).unwrap(), 0);
    assert_eq!(m.remaining_mut(), 0);
    assert!(m.chunk_mut().len() == 0);
    m.write_at(1, &[9, 9]);
    let d = m.freeze();
    assert!(d.eq_bytes(&[1, 9, 9, 4, 5, 6]));
    assert_eq!(d.num_fragments(), 2);
    assert!(d
        .fragments()
        .iter()
        .all(|f| f.segment().as_slice().as_ptr() == f.as_slice().as_ptr()));

    let mut frozen = Segment::from_vec(vec![0; 4]);
    frozen.freeze();
    assert!(IoDataMut::from_segments(vec![frozen], 4).is_err());
    assert!(IoDataMut::from_segments(vec![Segment::from_vec(vec![0; 3])], 4).is_err());

    let mut h = IoDataMut::with_capacity_heap(4);
    h.fill_from(b"ab");
    h.write_all(b"cd").unwrap();
    assert!(h.write_all(b"e").is_err());
    assert!(IoData::from(h).eq_bytes(b"abcd"));
}

#[test]
fn frozen_segments_are_read_only() {
    let d = IoDataMut::with_capacity_heap(3).freeze();
    let f = d.fragments()[0].clone();
    drop(d);
    let mut seg = Arc::clone(f.segment());
    drop(f);
    assert!(Arc::get_mut(&mut seg).unwrap().as_mut_slice().is_none());
}

#[test]
fn equality_ignores_fragmentation() {
    let (a, model) = pieces(&[1, 2, 3, 4]);
    let (b, _) = pieces(&[4, 3, 2, 1]);
    let (c, _) = pieces(&[10]);
    assert_eq!(a, b);
    assert_eq!(b, c);
    assert!(a == *model.as_slice());
    assert_ne!(a, a.slice(1..));
    assert_ne!(a.slice(..9), b.slice(1..));
    assert_eq!(a.iter_bytes().collect::<Vec<_>>(), model);
    let mut dst = [0u8; 4];
    a.copy_range_to_slice(2..6, &mut dst);
    assert_eq!(dst, model[2..6]);
}

#[test]
fn lot_span_adds_offset() {
    use crate::segment::LotId;
    let lot = LotId {
        slot: 3,
        generation: 7,
    };
    let mut v = vec![0u8; 16];
    let ptr = std::ptr::NonNull::new(v.as_mut_ptr()).unwrap();
    // SAFETY: `v` is moved into the keeper, which keeps its buffer alive as long as the
    // segment; nothing else touches it.
    let seg = unsafe {
        Segment::from_raw(
            ptr,
            16,
            Some(LotSpan { lot, offset: 4096 }),
            false,
            Arc::new(v),
        )
    };
    let d = IoData::from_segment(Arc::new(seg)).slice(5..9);
    assert_eq!(
        d.fragments()[0].lot_span(),
        Some(LotSpan { lot, offset: 4101 })
    );
}

#[test]
fn many_fragments() {
    let k = n(500, 40);
    let mut d = IoData::concat_all((0..k).map(|i| IoData::from_vec(vec![i as u8; 3])));
    assert_eq!(d.num_fragments(), k);
    let s = d.clone();
    let mut sum = 0usize;
    while d.has_remaining() {
        sum += d.get_u8() as usize;
    }
    assert_eq!(sum, 3 * (0..k).map(|i| i % 256).sum::<usize>());
    assert_eq!(s.len(), 3 * k);
}

#[test]
fn from_segments_refuses_read_only_segments() {
    let mut ro = Segment::from_vec(vec![0; 8]);
    ro.freeze();
    assert!(matches!(
        IoDataMut::from_segments(vec![ro], 8),
        Err(Error::NotWritable)
    ));
    assert!(matches!(
        IoDataMut::from_segments(vec![Segment::from_vec(vec![0; 4])], 8),
        Err(Error::InvalidArgument(_))
    ));
}
