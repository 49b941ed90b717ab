# fleet's probe of a node (fleet.facts.probe.parse_probe reads it): its name, home and login
# shell, the address its SSH server answers on, what its python says (python_facts.py, whose
# text is open on file descriptor 3), and the id of the storage under the workdir.
# $1: the node's python, $2: the command that reads a program from fd 3 (nodeside.loader),
# $3: the workdir, $4: the master's address ("": none), $5: a new storage id, recorded where the
# workdir has none yet ("": only read it), $6: "deep" for what `fleet check` asks too.
printf 'hostname=%s\n' "$(cat /proc/sys/kernel/hostname 2>/dev/null || hostname)"
printf 'home=%s\nshell=%s\n' "$HOME" "${SHELL:-}"
printf 'ssh=%s\n' "${SSH_CONNECTION:-}"
[ -z "$5" ] || mkdir -p "$3" 2>/dev/null
if [ "$6" = deep ]; then
  "$1" -c "$2" "$4" deep "$3" 2>&1
else
  "$1" -c "$2" "$4" 2>&1
fi
f=$3/.fleet-storage
# Atomic, NFS-safe: a hard link fails where the file exists.
[ -z "$5" ] || [ -s "$f" ] ||
  { printf '%s\n' "$5" > "$f.$5" && ln "$f.$5" "$f"; rm -f "$f.$5"; } 2>/dev/null
printf 'storage=%s\n' "$(cat "$f" 2>/dev/null)"
