# bash completion for spool(1). Installed as share/bash-completion/completions/spool.
#
# The commands and flags are read from spool's own help at completion time (`spool help`,
# `spool help CMD`), so this file never falls behind the CLI. Completes: the command after
# `spool` and `spool help`; a command's flags after `-`; the choices of a positional such as
# `dlq DIR {list,redrive,purge}`; otherwise directories (queues), and after `spool work DIR`
# or `--` a program and its files.

# The command names of `spool help` (its "Subcommands:" section).
_spool_commands() {
  "$1" help 2>/dev/null | awk '/^Subcommands:/ { on = 1; next }
    on && /^  [a-z]/ { print $1; next }
    on && /^[^ ]/ { exit }'
}

# The flags of `spool help CMD` ("-n UINT", "-a,--attribute TEXT", "--json").
_spool_flags() {
  "$1" help "$2" 2>/dev/null | awk '/^Options:/ { on = 1; next }
    on && /^[^ ]/ { exit }
    on && /^  -/ { n = split($1, f, ","); for (i = 1; i <= n; i++) print f[i] }'
}

# The choices of CMD's positionals ("ACTION TEXT:{list,redrive,purge}"), one a line.
_spool_choices() {
  "$1" help "$2" 2>/dev/null | sed -n 's/.*:{\([^}]*\)}.*/\1/p' | tr ',' '\n'
}

# The flags of `spool help CMD` that take a value ("-j UINT", "--visibility TEXT").
_spool_value_flags() {
  "$1" help "$2" 2>/dev/null | awk '/^Options:/ { on = 1; next }
    on && /^[^ ]/ { exit }
    on && /^  -/ && $2 ~ /^[A-Z]/ { n = split($1, f, ","); for (i = 1; i <= n; i++) print f[i] }'
}

_spool() {
  local cur=${COMP_WORDS[COMP_CWORD]} spool=${COMP_WORDS[0]} cmd="" at=0 i w
  command -v "$spool" >/dev/null 2>&1 || spool=spool
  # The command is the first word after `spool` that is not a flag.
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in -*) ;; *) cmd=${COMP_WORDS[i]}; at=$i; break ;; esac
  done
  if [ -z "$cmd" ]; then
    case $cur in
      -*) COMPREPLY=($(compgen -W "--help --version" -- "$cur")) ;;
      *) COMPREPLY=($(compgen -W "$(_spool_commands "$spool") help" -- "$cur")) ;;
    esac
    return 0
  fi
  if [ "$cmd" = help ]; then
    [ $((COMP_CWORD - at)) = 1 ] && COMPREPLY=($(compgen -W "$(_spool_commands "$spool")" -- "$cur"))
    return 0
  fi
  # How many positionals come before the word being completed (a flag's value is none),
  # and whether a `--` ended spool's options.
  local values positionals=0 dashdash=0 skip=0
  values=" $(_spool_value_flags "$spool" "$cmd" | tr '\n' ' ') "
  for ((i = at + 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    if [ $skip = 1 ]; then skip=0; continue; fi
    if [ $dashdash = 1 ]; then positionals=$((positionals + 1)); continue; fi
    case $w in
      --) dashdash=1 ;;
      -*) [[ $values == *" $w "* ]] && skip=1 ;;
      *) positionals=$((positionals + 1)) ;;
    esac
  done
  [ $skip = 1 ] && { compopt -o default 2>/dev/null; COMPREPLY=(); return 0; }  # a flag's value
  # spool work DIR CMD...: the word after DIR is a program, then its own arguments.
  if [ "$cmd" = work ] && { [ $positionals -ge 1 ] || [ $dashdash = 1 ]; }; then
    if [ $positionals -le 1 ] && [[ $cur != -* ]]; then
      COMPREPLY=($(compgen -c -- "$cur"))
    else
      compopt -o filenames 2>/dev/null
      COMPREPLY=($(compgen -f -- "$cur"))
    fi
    return 0
  fi
  case $cur in
    -*) COMPREPLY=($(compgen -W "$(_spool_flags "$spool" "$cmd")" -- "$cur")) ;;
    *)
      local choices
      choices=$(_spool_choices "$spool" "$cmd")
      if [ $positionals -ge 1 ] && [ -n "$choices" ]; then
        COMPREPLY=($(compgen -W "$choices" -- "$cur"))
      else
        compopt -o filenames 2>/dev/null
        COMPREPLY=($(compgen -d -- "$cur"))
      fi
      ;;
  esac
  return 0
}
complete -F _spool spool
