//! The XDP redirect programs, built from their instructions (no compiler, no libbpf),
//! and the XSKMAP they redirect through.
//!
//! Two programs, both ending in `bpf_redirect_map(map, key, XDP_PASS)`: the helper
//! returns `XDP_REDIRECT` when the map has a socket at `key`, and its third argument
//! (`XDP_PASS`) otherwise, so a frame with no socket for it goes up the normal stack.
//! Removing a map entry is therefore the whole of revocation.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::sys;

/// The `xdp_md` context fields the programs read (offsets into it).
const CTX_DATA: i16 = 0;
const CTX_DATA_END: i16 = 4;
const CTX_RX_QUEUE_INDEX: i16 = 16;
/// The action for frames the map has no socket for.
const XDP_PASS: i32 = 2;
/// The helper `bpf_redirect_map(map, key, flags)`.
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `src_reg` of a 64-bit immediate load that names a map by descriptor.
const BPF_PSEUDO_MAP_FD: u8 = 1;

// Opcodes: class | size/operation | mode/source.
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const LDX_MEM_H: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
const LDX_MEM_B: u8 = 0x71; // BPF_LDX | BPF_MEM | BPF_B
const LD_IMM_DW: u8 = 0x18; // BPF_LD | BPF_IMM | BPF_DW (two slots)
const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const MOV64_X: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
const ADD64_K: u8 = 0x07; // BPF_ALU64 | BPF_ADD | BPF_K
const JGT_X: u8 = 0x2d; // BPF_JMP | BPF_JGT | BPF_X
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const END_TO_BE: u8 = 0xdc; // BPF_ALU | BPF_END | BPF_TO_BE
const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// One instruction: opcode, destination and source registers (low and high nibble),
/// a signed 16-bit offset and a signed 32-bit immediate, little-endian.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    (code as u64)
        | (((dst & 0xf) | ((src & 0xf) << 4)) as u64) << 8
        | ((off as u16) as u64) << 16
        | ((imm as u32) as u64) << 32
}

/// `r1 = map` (the map's descriptor, which the kernel replaces by the map): two slots.
fn ld_map(dst: u8, map: BorrowedFd<'_>) -> [u64; 2] {
    use std::os::fd::AsRawFd;
    [
        insn(LD_IMM_DW, dst, BPF_PSEUDO_MAP_FD, 0, map.as_raw_fd()),
        0,
    ]
}

/// How frames are matched to sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steer {
    /// Every frame of receive queue `q` goes to the socket at key `q`: the five
    /// instructions of the minimal redirect program. A queue is wholly the application's
    /// (ARP included), so the NIC must steer only its flows there.
    Queue,
    /// IPv4 UDP frames go to the socket at key = their destination port; everything else
    /// (ARP, ICMP, TCP, other ports, IP options, fragments) stays on the normal stack.
    UdpPort,
}

/// The program's instructions for `map`.
pub fn program(steer: Steer, map: BorrowedFd<'_>) -> Vec<u64> {
    let mut p = Vec::new();
    match steer {
        Steer::Queue => {
            // r2 = ctx->rx_queue_index: the key.
            p.push(insn(LDX_MEM_W, 2, 1, CTX_RX_QUEUE_INDEX, 0));
            // r1 = the XSKMAP.
            p.extend(ld_map(1, map));
            // r3 = XDP_PASS: what the helper returns when the key has no socket.
            p.push(insn(MOV64_K, 3, 0, 0, XDP_PASS));
            // r0 = bpf_redirect_map(r1, r2, r3).
            p.push(insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP));
            // return r0.
            p.push(insn(EXIT, 0, 0, 0, 0));
        }
        Steer::UdpPort => {
            // Offsets into the frame: Ethernet type at 12, IPv4 version/IHL at 14,
            // protocol at 23, UDP destination port at 14 + 20 + 2 = 36; all 42 header
            // bytes must lie before data_end.
            let pass = 18i16; // index of the "return XDP_PASS" tail
            let to_pass = |at: i16| pass - (at + 1);
            // 0: r2 = ctx->data.
            p.push(insn(LDX_MEM_W, 2, 1, CTX_DATA, 0));
            // 1: r3 = ctx->data_end.
            p.push(insn(LDX_MEM_W, 3, 1, CTX_DATA_END, 0));
            // 2: r4 = r2.
            p.push(insn(MOV64_X, 4, 2, 0, 0));
            // 3: r4 += 42 (Ethernet + IPv4 without options + UDP headers).
            p.push(insn(ADD64_K, 4, 0, 0, 42));
            // 4: if r4 > r3 goto pass (a shorter frame; this bound is what lets the
            // verifier accept the loads below).
            p.push(insn(JGT_X, 4, 3, to_pass(4), 0));
            // 5: r4 = *(u16 *)(r2 + 12): the Ethernet type, as loaded little-endian.
            p.push(insn(LDX_MEM_H, 4, 2, 12, 0));
            // 6: if r4 != 0x0008 (0x0800, IPv4, in network order) goto pass.
            p.push(insn(JNE_K, 4, 0, to_pass(6), 0x0008));
            // 7: r4 = *(u8 *)(r2 + 14): IPv4 version and header length.
            p.push(insn(LDX_MEM_B, 4, 2, 14, 0));
            // 8: if r4 != 0x45 goto pass (version 4, 20-byte header: no options).
            p.push(insn(JNE_K, 4, 0, to_pass(8), 0x45));
            // 9: r4 = *(u8 *)(r2 + 23): the IP protocol.
            p.push(insn(LDX_MEM_B, 4, 2, 23, 0));
            // 10: if r4 != 17 (UDP) goto pass.
            p.push(insn(JNE_K, 4, 0, to_pass(10), 17));
            // 11: r2 = *(u16 *)(r2 + 36): the UDP destination port, network order.
            p.push(insn(LDX_MEM_H, 2, 2, 36, 0));
            // 12: r2 = be16 -> host order: the key.
            p.push(insn(END_TO_BE, 2, 0, 0, 16));
            // 13-14: r1 = the XSKMAP.
            p.extend(ld_map(1, map));
            // 15: r3 = XDP_PASS, the action when no socket holds the port.
            p.push(insn(MOV64_K, 3, 0, 0, XDP_PASS));
            // 16: r0 = bpf_redirect_map(r1, r2, r3).
            p.push(insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP));
            // 17: return r0.
            p.push(insn(EXIT, 0, 0, 0, 0));
            // 18 (pass): r0 = XDP_PASS.
            p.push(insn(MOV64_K, 0, 0, 0, XDP_PASS));
            // 19: return r0.
            p.push(insn(EXIT, 0, 0, 0, 0));
            debug_assert_eq!(p.len(), pass as usize + 2);
        }
    }
    p
}

/// How the program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Generic XDP, after the kernel made an skb: works on every interface.
    Skb,
    /// In the driver (veth supports it), before any skb.
    Drv,
}

/// An attached redirect program with its XSKMAP; detached when dropped (the BPF link
/// is the only reference; nothing is pinned).
#[derive(Debug)]
pub struct Redirect {
    map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
    /// The interface it is attached to.
    pub ifindex: u32,
    /// How it steers.
    pub steer: Steer,
}

impl Redirect {
    /// Creates the map, loads the program and attaches it to `ifindex`.
    pub fn attach(ifindex: u32, steer: Steer, mode: AttachMode) -> io::Result<Redirect> {
        let entries = match steer {
            Steer::Queue => 64,
            Steer::UdpPort => 65536,
        };
        let map = sys::xskmap_create(entries)?;
        let prog = sys::prog_load_xdp(&program(steer, map.as_fd()))?;
        let flags = match mode {
            AttachMode::Skb => 2,
            AttachMode::Drv => 4,
        };
        let link = sys::link_create_xdp(prog.as_fd(), ifindex, flags)?;
        Ok(Redirect {
            map,
            _prog: prog,
            _link: link,
            ifindex,
            steer,
        })
    }

    /// Sends frames with `key` to socket `xsk` (bound to this interface).
    pub fn insert(&self, key: u32, xsk: BorrowedFd<'_>) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        sys::map_update(self.map.as_fd(), key, xsk.as_raw_fd() as u32)
    }

    /// Returns frames with `key` to the normal stack.
    pub fn remove(&self, key: u32) -> io::Result<()> {
        sys::map_delete(self.map.as_fd(), key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instruction_encoding() {
        // r2 = *(u32 *)(r1 + 16), as `llvm-objdump` shows it: 61 12 10 00 00 00 00 00.
        assert_eq!(
            insn(LDX_MEM_W, 2, 1, 16, 0).to_le_bytes(),
            [0x61, 0x12, 0x10, 0, 0, 0, 0, 0]
        );
        // if r4 != 17 goto +7: 55 04 07 00 11 00 00 00.
        assert_eq!(
            insn(JNE_K, 4, 0, 7, 17).to_le_bytes(),
            [0x55, 0x04, 0x07, 0, 0x11, 0, 0, 0]
        );
    }
}
