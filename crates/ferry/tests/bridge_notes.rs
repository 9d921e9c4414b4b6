//! Bridge notes between real processes: what `ServiceInfo::origin` (and so `ferry stat`)
//! says about a service a bridge imports or carries. A member's note counts while it is
//! alive and a member; a hostile member's forged, overlong or invalid note reads as
//! damaged or as no note, in the member's view and in the read-only view `ferry stat`
//! uses, and never crashes either. Each child is this test binary re-executed in a role
//! (`harness = false`).

mod common;

use std::io::BufRead;

use common::*;
use ferry::{Group, Origin, Publisher, ServiceConfig, ServiceInfo, Subscriber, MAX_FAR};

// ---------------------------------------------------------------- child roles

fn child_main(role: &str) {
    let (gname, _group, domain, arg, mut stdin) = child_start();
    match role {
        // ARG "service|far": subscribe, record that we carry it to `far`, wait.
        "carrier" => {
            let (name, far) = arg.split_once('|').unwrap();
            let sub = Subscriber::open(&domain, name, T).unwrap();
            sub.set_carried_to(far).unwrap();
            println!("noted");
            read_line(&mut stdin);
            // Leaving takes the note back.
            drop(sub);
            println!("left");
            read_line(&mut stdin);
        }
        // Each line of stdin: "OFFSET WORD WORD ..." writes the words from byte OFFSET of
        // the control memfd, as a hostile member can; prints "ok".
        "forger" => {
            let map = map_control_block(&gname);
            loop {
                let mut l = String::new();
                if stdin.read_line(&mut l).unwrap() == 0 {
                    break;
                }
                let mut words = l.split_whitespace().map(|w| w.parse::<u64>().unwrap());
                let Some(off) = words.next() else { break };
                for (k, w) in words.enumerate() {
                    write_word(&map, off as usize + 4 * k, w as u32);
                }
                println!("ok");
            }
        }
        _ => panic!("unknown role {role}"),
    }
}

// ---------------------------------------------------------------- helpers

/// The member word of a domain, as the service table records it.
fn member_word(id: ferry::DomainId) -> u32 {
    (id.slot as u32 + 1) | (id.generation & 0x00ff_ffff) << 8
}

/// The note words from the seq on: seq, role, writer, writer's generation, version,
/// length, then `text` (zero-padded to the note's size).
fn note_words(role: u32, writer: ferry::DomainId, version: u32, len: u32, text: &[u8]) -> String {
    let mut bytes = text.to_vec();
    bytes.resize(MAX_FAR, 0);
    let mut w = vec![
        2,
        role,
        member_word(writer),
        writer.generation,
        version,
        len,
    ];
    w.extend(
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes(c.try_into().unwrap())),
    );
    w.iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The service's entry in the member's view and in the read-only view `ferry stat`
/// uses; both must agree.
fn origin(g: &Group, gname: &str, name: &str) -> Origin {
    let find = |l: Vec<ServiceInfo>| l.into_iter().find(|s| s.name == name).unwrap();
    let mine = find(g.services()).origin;
    let view = match Group::inspect(gname).state {
        ferry::stats::GroupFileState::Live(v) => v,
        _ => panic!("the group cannot be inspected"),
    };
    assert_eq!(find(view.services()).origin, mine, "the two views disagree");
    mine
}

// ---------------------------------------------------------------- tests

/// A carrier process's note shows as `Carried` by it; it goes when the carrier leaves
/// and when it is killed; the owner's own note shows as `Bridged`.
fn notes_follow_their_writers() {
    let (g, d, gname) = join("notes");
    let p = Publisher::offer(&d, "cam", ServiceConfig::default()).unwrap();
    assert_eq!(origin(&g, &gname, "cam"), Origin::Local);

    let mut c = Peer::spawn("carrier", &gname, "cam|host-b (zid 42)");
    assert_eq!(c.line(), "noted");
    match origin(&g, &gname, "cam") {
        Origin::Carried { by, to } => {
            assert_eq!((by.pid, to.as_str()), (c.child.id(), "host-b (zid 42)"))
        }
        other => panic!("a carrier's note reads as {other:?}"),
    }
    c.tell("leave");
    assert_eq!(c.line(), "left");
    assert_eq!(
        origin(&g, &gname, "cam"),
        Origin::Local,
        "a left carrier's note"
    );
    c.kill9();

    let mut c = Peer::spawn("carrier", &gname, "cam|host-c");
    assert_eq!(c.line(), "noted");
    assert!(matches!(origin(&g, &gname, "cam"), Origin::Carried { .. }));
    c.kill9();
    assert_eq!(
        origin(&g, &gname, "cam"),
        Origin::Local,
        "a dead carrier's note"
    );

    p.set_bridged_from("host-a (zid 7)").unwrap();
    assert_eq!(
        origin(&g, &gname, "cam"),
        Origin::Bridged {
            far: "host-a (zid 7)".into()
        }
    );
    // What the owner may write is checked before it is written.
    assert!(p.set_bridged_from(&"x".repeat(MAX_FAR + 1)).is_err());
    assert!(p.set_bridged_from("evil\x1b[2J").is_err());
    p.set_bridged_from("").unwrap();
    assert_eq!(origin(&g, &gname, "cam"), Origin::Local);
}

/// A hostile member forges notes: one in its own name for a service it does not own,
/// overlong, not UTF-8, with terminal control characters, of an unknown role, or left
/// half-written reads as `Damaged`; one in a dead domain's name or for an older claim
/// of the entry reads as no note; random words never crash a reader. The owner's next
/// note is read again.
fn forged_notes_are_damaged_or_ignored() {
    let (g, d, gname) = join("forged");
    let p = Publisher::offer(&d, "cam", ServiceConfig::default()).unwrap();
    let (off, version) = ferry::testing::bridge_note_at(&g, "cam").unwrap();
    let mut f = Peer::spawn("forger", &gname, "");
    let me = d.id();
    let forger = f.id;
    let mut write = |words: String| {
        f.tell(&format!("{off} {words}"));
        assert_eq!(f.line(), "ok");
    };
    let dead = ferry::DomainId {
        slot: 60,
        generation: 12345,
    };
    let cases: Vec<(&str, String, Origin)> = vec![
        (
            "its own name, not the owner",
            note_words(1, forger, version, 4, b"evil"),
            Origin::Damaged,
        ),
        (
            "its own name, not a member",
            note_words(2, forger, version, 4, b"evil"),
            Origin::Damaged,
        ),
        (
            "overlong",
            note_words(1, me, version, 4000, b"evil"),
            Origin::Damaged,
        ),
        ("empty", note_words(1, me, version, 0, b""), Origin::Damaged),
        (
            "not UTF-8",
            note_words(1, me, version, 4, &[0xff, 0xfe, 0x41, 0x80]),
            Origin::Damaged,
        ),
        (
            "control characters",
            note_words(1, me, version, 8, b"a\x1b[2Jb\r\n"),
            Origin::Damaged,
        ),
        (
            "unknown role",
            note_words(9, me, version, 4, b"evil"),
            Origin::Damaged,
        ),
        (
            "a dead writer",
            note_words(1, dead, version, 4, b"evil"),
            Origin::Local,
        ),
        (
            "an older claim",
            note_words(1, me, version.wrapping_sub(1), 4, b"evil"),
            Origin::Local,
        ),
    ];
    for (what, words, want) in cases {
        write(words);
        assert_eq!(origin(&g, &gname, "cam"), want, "a forged note: {what}");
    }
    // A write that never ends (seq left odd).
    write(format!(
        "3 1 {} {} {version} 4",
        member_word(me),
        me.generation
    ));
    assert_eq!(
        origin(&g, &gname, "cam"),
        Origin::Damaged,
        "a half-written note"
    );
    // Random words: any answer, no crash.
    let mut rng = seed_rng();
    for round in 0..200 {
        let words: Vec<String> = (0..31)
            .map(|k| {
                let v = match (round % 3, k) {
                    (0, _) => rng.next() as u32,
                    (_, 0) => (rng.next() % 4) as u32 * 2,
                    (_, 2) => member_word(if rng.next() % 2 == 0 { me } else { forger }),
                    (_, 3) => me.generation,
                    (_, 4) => version,
                    (_, 5) => (rng.next() % 120) as u32,
                    _ => rng.next() as u32,
                };
                v.to_string()
            })
            .collect();
        write(words.join(" "));
        let o = origin(&g, &gname, "cam");
        if let Origin::Bridged { far } | Origin::Carried { to: far, .. } = &o {
            assert!(far.len() <= MAX_FAR && !far.chars().any(char::is_control));
        }
    }
    // The owner's own note is read again.
    p.set_bridged_from("host-a").unwrap();
    assert_eq!(
        origin(&g, &gname, "cam"),
        Origin::Bridged {
            far: "host-a".into()
        }
    );
    f.kill9();
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        ("notes_follow_their_writers", notes_follow_their_writers),
        (
            "forged_notes_are_damaged_or_ignored",
            forged_notes_are_damaged_or_ignored,
        ),
    ]);
}
