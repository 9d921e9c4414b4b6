//! Property tests of `IoData` against a `Vec<u8>` model, plus existing consumers
//! (serde_json, flate2) reading fragmented `IoData` in place.

use std::borrow::Cow;
use std::io::{IoSlice, Read, Write};

use bytes::Buf;
use ferry::IoData;
use proptest::prelude::*;

/// Memory ranges `[start, end)` of every vector handed to `IoData::from_vec` in a case.
#[derive(Default)]
struct Origins(Vec<(usize, usize)>);

impl Origins {
    /// Wraps each piece without copying, recording where its bytes live.
    fn build(&mut self, pieces: &[Vec<u8>]) -> (IoData, Vec<u8>) {
        let model = pieces.concat();
        let parts: Vec<IoData> = pieces
            .iter()
            .map(|p| {
                let v = p.clone();
                let start = v.as_ptr() as usize;
                self.0.push((start, start + v.len()));
                IoData::from_vec(v)
            })
            .collect();
        (IoData::concat_all(parts), model)
    }

    fn contains(&self, bytes: &[u8]) -> bool {
        let (s, e) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        self.0.iter().any(|&(a, b)| a <= s && e <= b)
    }

    /// Bytes equal the model, fragments are non-empty and all point into original vectors.
    fn check(&self, d: &IoData, model: &[u8]) -> Result<(), TestCaseError> {
        prop_assert_eq!(d.len(), model.len());
        prop_assert!(d.eq_bytes(model));
        prop_assert_eq!(d.to_vec(), model);
        prop_assert_eq!(
            d.fragments().iter().map(|f| f.len()).sum::<usize>(),
            d.len()
        );
        for f in d.fragments() {
            prop_assert!(!f.is_empty());
            prop_assert!(
                self.contains(f.as_slice()),
                "fragment points outside the originals: copied"
            );
            prop_assert_eq!(
                f.as_slice().as_ptr(),
                f.segment().as_slice()[f.offset()..].as_ptr()
            );
        }
        Ok(())
    }
}

fn pieces() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..6)
}

#[derive(Clone, Debug)]
enum Op {
    Slice(usize, usize),
    SplitKeepFront(usize),
    SplitKeepBack(usize),
    SplitTo(usize),
    SplitOff(usize),
    Truncate(usize),
    ConcatAfter(Vec<Vec<u8>>),
    ConcatBefore(Vec<Vec<u8>>),
    Append(Vec<Vec<u8>>),
    Clone,
    Advance(usize),
    Read(usize),
    CopyToBytes(usize),
    Units(usize),
    Cursor(usize),
    Vectored(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let idx = any::<usize>();
    prop_oneof![
        (idx, idx).prop_map(|(a, b)| Op::Slice(a, b)),
        idx.prop_map(Op::SplitKeepFront),
        idx.prop_map(Op::SplitKeepBack),
        idx.prop_map(Op::SplitTo),
        idx.prop_map(Op::SplitOff),
        idx.prop_map(Op::Truncate),
        pieces().prop_map(Op::ConcatAfter),
        pieces().prop_map(Op::ConcatBefore),
        pieces().prop_map(Op::Append),
        Just(Op::Clone),
        idx.prop_map(Op::Advance),
        (0usize..64).prop_map(Op::Read),
        idx.prop_map(Op::CopyToBytes),
        (1usize..48).prop_map(Op::Units),
        idx.prop_map(Op::Cursor),
        (0usize..8).prop_map(Op::Vectored),
    ]
}

/// Start offsets of each fragment, plus the total length.
fn boundaries(d: &IoData) -> Vec<usize> {
    let mut at = 0;
    let mut v = vec![0];
    for f in d.fragments() {
        at += f.len();
        v.push(at);
    }
    v
}

fn apply(
    o: &mut Origins,
    d: &mut IoData,
    model: &mut Vec<u8>,
    op: Op,
    keep: &mut Vec<(IoData, Vec<u8>)>,
) -> Result<(), TestCaseError> {
    let len = model.len();
    let at = |x: usize| x % (len + 1);
    match op {
        Op::Slice(a, b) => {
            let a = at(a);
            let b = a + b % (len - a + 1);
            let s = d.slice(a..b);
            prop_assert_eq!(d.try_slice(a..b), Some(s.clone()));
            *d = s;
            *model = model[a..b].to_vec();
        }
        Op::SplitKeepFront(x) => {
            let x = at(x);
            let (front, back) = d.split_at(x);
            o.check(&back, &model[x..])?;
            *d = front;
            model.truncate(x);
        }
        Op::SplitKeepBack(x) => {
            let x = at(x);
            let (front, back) = d.split_at(x);
            o.check(&front, &model[..x])?;
            *d = back;
            model.drain(..x);
        }
        Op::SplitTo(x) => {
            let x = at(x);
            let front = d.split_to(x);
            o.check(&front, &model[..x])?;
            model.drain(..x);
        }
        Op::SplitOff(x) => {
            let x = at(x);
            let back = d.split_off(x);
            o.check(&back, &model[x..])?;
            model.truncate(x);
        }
        Op::Truncate(x) => {
            let x = x % (len + 2); // sometimes past the end: no-op
            d.truncate(x);
            model.truncate(x);
        }
        Op::ConcatAfter(p) => {
            let (other, m) = o.build(&p);
            *d = d.concat(&other);
            model.extend_from_slice(&m);
        }
        Op::ConcatBefore(p) => {
            let (other, mut m) = o.build(&p);
            *d = other.concat(d);
            m.extend_from_slice(model);
            *model = m;
        }
        Op::Append(p) => {
            let (other, m) = o.build(&p);
            d.append(other);
            model.extend_from_slice(&m);
        }
        Op::Clone => {
            keep.push((d.clone(), model.clone()));
        }
        Op::Advance(k) => {
            let k = at(k);
            d.advance(k);
            model.drain(..k);
        }
        Op::Read(k) => {
            let mut buf = vec![0xEEu8; k];
            let n = d.read(&mut buf).unwrap();
            prop_assert_eq!(n, k.min(len));
            prop_assert_eq!(&buf[..n], &model[..n]);
            model.drain(..n);
        }
        Op::CopyToBytes(k) => {
            let k = at(k);
            let b = d.copy_to_bytes(k);
            prop_assert_eq!(&b[..], &model[..k]);
            model.drain(..k);
        }
        Op::Units(n) => {
            let bounds = boundaries(d);
            let mut units = d.units(n);
            let mut joined = Vec::new();
            let mut start = 0;
            for u in units.by_ref() {
                let end = start + u.len();
                prop_assert!(!u.is_empty() && u.len() <= n);
                let straddles = bounds.iter().any(|&b| start < b && b < end);
                match &u {
                    Cow::Borrowed(s) => {
                        prop_assert!(
                            !straddles,
                            "unit {}..{} straddles but was borrowed",
                            start,
                            end
                        );
                        prop_assert!(o.contains(s));
                    }
                    Cow::Owned(_) => {
                        prop_assert!(straddles, "unit {}..{} was copied needlessly", start, end)
                    }
                }
                joined.extend_from_slice(&u);
                start = end;
            }
            prop_assert_eq!(&joined, model);
            prop_assert_eq!(
                units.borrowed_units() + units.copied_units(),
                len.div_ceil(n)
            );
        }
        Op::Cursor(k) => {
            let k = at(k);
            let mut r = d.cursor();
            r.advance(k);
            let mut rest = Vec::new();
            r.read_to_end(&mut rest).unwrap();
            prop_assert_eq!(&rest, &model[k..]);
        }
        Op::Vectored(n) => {
            let mut slots = vec![IoSlice::new(&[]); n];
            let filled = d.chunks_vectored(&mut slots);
            prop_assert_eq!(filled, n.min(d.num_fragments()));
            let got: Vec<u8> = slots[..filled]
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect();
            prop_assert_eq!(&got, &model[..got.len()]);
            prop_assert_eq!(
                d.chunk(),
                d.fragments().first().map_or(&[][..], |f| f.as_slice())
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn ops_match_vec_model(start in pieces(), ops in prop::collection::vec(op(), 0..24)) {
        let mut o = Origins::default();
        let (mut d, mut model) = o.build(&start);
        let mut keep = Vec::new();
        o.check(&d, &model)?;
        for op in ops {
            apply(&mut o, &mut d, &mut model, op, &mut keep)?;
            o.check(&d, &model)?;
        }
        // Clones taken along the way were not disturbed by in-place edits of the other copy.
        for (k, m) in &keep {
            o.check(k, m)?;
        }
    }

    #[test]
    fn json_split_anywhere(cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        let doc = br#"{"name":"ferry","sizes":[1,22,333],"nested":{"ok":true,"pi":3.25}}"#;
        let d = split_at_points(doc, &cuts);
        let v: serde_json::Value = serde_json::from_reader(d).unwrap();
        prop_assert_eq!(v["sizes"][2].as_u64(), Some(333));
        prop_assert_eq!(v["nested"]["pi"].as_f64(), Some(3.25));
    }
}

/// `bytes` copied into separate vectors at the given cut points (mod len).
fn split_at_points(bytes: &[u8], cuts: &[usize]) -> IoData {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.push(0);
    cuts.push(bytes.len());
    cuts.sort_unstable();
    cuts.dedup();
    IoData::concat_all(
        cuts.windows(2)
            .map(|w| IoData::from_vec(bytes[w[0]..w[1]].to_vec())),
    )
}

/// `bytes` in fragments of `n` bytes each, each its own vector.
fn in_fragments(bytes: &[u8], n: usize) -> IoData {
    IoData::concat_all(bytes.chunks(n).map(|c| IoData::from_vec(c.to_vec())))
}

#[test]
fn serde_json_reads_fragmented_document_in_place() {
    let doc = br#"{"id": 7, "tags": ["zero", "copy"], "payload": {"len": 4096, "lot": [3, 17]}}"#;
    let d = in_fragments(doc, 9);
    assert!(d.num_fragments() > 5);
    let v: serde_json::Value = serde_json::from_reader(d.clone()).unwrap();
    assert_eq!(v["tags"][1], "copy");
    assert_eq!(v["payload"]["lot"][1], 17);
    // Through the non-consuming cursor too; `d` stays intact.
    let w: serde_json::Value = serde_json::from_reader(d.cursor()).unwrap();
    assert_eq!(v, w);
    assert_eq!(d.len(), doc.len());
}

#[test]
fn gzip_decoder_reads_fragmented_stream_in_place() {
    let text: String = (0..200)
        .map(|i| format!("line {i}: fbufs carry data across domains\n"))
        .collect();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).unwrap();
    let gz = enc.finish().unwrap();
    for frag in [1, 7, 64, gz.len()] {
        let d = in_fragments(&gz, frag);
        let mut out = String::new();
        flate2::read::GzDecoder::new(d.cursor())
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, text, "fragments of {frag}");
        let mut out = String::new();
        flate2::read::GzDecoder::new(d)
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, text, "fragments of {frag}, consuming");
    }
}

#[test]
fn buf_getters_cross_fragment_boundaries() {
    let mut wire = Vec::new();
    wire.extend_from_slice(&0xdead_beefu32.to_be_bytes());
    wire.extend_from_slice(&0x0102u16.to_le_bytes());
    wire.extend_from_slice(&(-5i64).to_be_bytes());
    let mut d = in_fragments(&wire, 3);
    assert_eq!(d.get_u32(), 0xdead_beef);
    assert_eq!(d.get_u16_le(), 0x0102);
    assert_eq!(d.get_i64(), -5);
    assert!(!d.has_remaining());
}
