#!/bin/bash
# What dist/ ships for the system's tools (issue 43): the bash completion, driven as bash
# drives it (COMP_WORDS/COMP_CWORD, then the function `complete -p spool` names), and the
# systemd unit template checked by systemd-analyze verify (or, where systemd is not
# installed, parsed here for the settings the docs promise).
# Usage: dist_test.sh SPOOL COMPLETION_FILE UNIT_FILE
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"
SPOOL=$(abs "$1"); COMPLETION=$(abs "$2"); UNIT=$(abs "$3")
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/spool-dist-test.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT

# complete WORD...: what the completion offers for `spool WORD...` (the last word is the one
# being completed), one a line, sorted.
complete_words() {
  bash --norc --noprofile -c '
    source "$1"; shift
    fn=$(complete -p spool | sed -n "s/.*-F \([^ ]*\) spool$/\1/p")
    [ -n "$fn" ] || { echo "complete -p spool names no function" >&2; exit 1; }
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    COMPREPLY=()
    "$fn" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    printf "%s\n" "${COMPREPLY[@]}" | sort -u' complete "$COMPLETION" "$SPOOL" "$@"
}

t_completes_every_subcommand() {
  local want got
  want=$("$SPOOL" help | awk '/^Subcommands:/ {on=1; next} on && /^  [a-z]/ {print $1} on && /^[^ ]/ {exit}' | sort)
  [ "$(wc -l <<<"$want")" -ge 20 ] || fail "spool help lists too few commands: $want"
  got=$(complete_words "")
  for c in $want help; do grep -qx "$c" <<<"$got" || fail "'spool <TAB>' lacks $c: $got"; done
  eq "spool se<TAB>" "$(complete_words se | tr '\n' ' ')" "send serve "
  eq "spool help wo<TAB>" "$(complete_words help wo)" "work"
}

t_completes_flags_and_choices() {
  local got
  got=$(complete_words send q --d)
  eq "spool send q --d<TAB>" "$(tr '\n' ' ' <<<"$got")" "--dedup-id --delay --durable "
  eq "spool dlq q <TAB>" "$(complete_words dlq q "" | tr '\n' ' ')" "list purge redrive "
  mkdir -p "$D/queues/jobs" "$D/queues/mail"
  cd "$D/queues" || fail "cd"
  eq "spool stats <TAB> (directories)" "$(complete_words stats "" | tr '\n' ' ')" "jobs mail "
  # spool work -j 4 DIR CMD: a value of -j is no positional; after DIR comes a program
  got=$(complete_words work -j 4 jobs bas)
  grep -qx bash <<<"$got" || fail "'spool work -j 4 jobs bas<TAB>' lacks bash: $got"
}

t_unit_template() {
  local unit="$D/spool-work@jobs.service" out
  # the unit with this build's spool, so that verify finds ExecStart's program
  sed "s|^ExecStart=[^ ]*/spool |ExecStart=$SPOOL |" "$UNIT" >"$unit"
  grep -qx 'KillMode=mixed' "$unit" || fail "no KillMode=mixed"
  grep -q '^EnvironmentFile=.*/spool/work/%i.env$' "$unit" || fail "no EnvironmentFile per instance"
  grep -q '^ExecStart=.* work $SPOOL_WORK_OPTIONS ${QUEUE} -- $COMMAND$' "$unit" || fail "ExecStart: $(grep ExecStart "$unit")"
  if command -v systemd-analyze >/dev/null; then
    out=$(systemd-analyze verify --man=no "$unit" 2>&1) || fail "systemd-analyze verify: $out"
    [ -z "$out" ] || fail "systemd-analyze verify warns: $out"
    echo "verified by $(systemd-analyze --version | head -n1)"
  else
    echo "systemd-analyze is not installed: the unit is checked by its syntax here only"
    awk '/^\[(Unit|Service|Install)\]$/ {next} /^#/ || /^$/ {next}
      !/^[A-Z][A-Za-z]+=/ {print "bad line " NR ": " $0; bad = 1} END {exit bad}' "$unit" ||
      fail "the unit has lines that are neither a section, a comment nor Key=value"
  fi
}

TESTS=(t_completes_every_subcommand t_completes_flags_and_choices t_unit_template)
run_tests true
