// Mappings of files that another process may truncate (the index, segments). A page of a
// shared mapping past the end of its file is a SIGBUS on access, and a process that may
// write a queue can `truncate` its files at any moment, also in the middle of a locked
// operation of another process, where no check before the access can help.
//
// guard() registers a mapping. A SIGBUS whose faulting address lies in a registered
// mapping replaces that whole mapping with private zero-filled pages at the same addresses
// and protection, and sets the mapping's flag; the faulting access is then retried and
// reads zeros (which nothing takes for valid: a record needs its magic and checksum, the
// index its magic), and stores go to private memory. The owner of the mapping sees the flag
// at its next check and reports the file as cut (docs/durability.md). Any other SIGBUS
// (outside the guarded mappings, sent by kill(), or a misaligned access, BUS_ADRALN, which
// zero pages would not cure) goes to the handler installed before the first guard(), or
// kills the process as it would have without spool.
//
// The handler is installed once, at the first guard(); a program that installs its own
// SIGBUS handler after that replaces it (and takes the crash back). Up to kMaxGuarded
// mappings per process are guarded; past that, a mapping is not (logged once).
#pragma once

#include <atomic>
#include <cstddef>

namespace spool::sys {

inline constexpr size_t kMaxGuarded = 16384;

// `prot`: the mapping's protection (PROT_READ, PROT_READ | PROT_WRITE), which the zero
// pages get too. `*cut` is set when a SIGBUS replaced the mapping; it must outlive the
// registration. False if the table is full (the mapping is then unguarded).
bool guard_mapping(const void* addr, size_t len, int prot, std::atomic<bool>* cut);
// Before the mapping is unmapped: its addresses may be reused by an unguarded one.
void unguard_mapping(const void* addr);

}  // namespace spool::sys
