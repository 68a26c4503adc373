#!/bin/sh
# Starts tutti-stagerd with the sizes that follow from its pod, then the
# manifest's own flags (a flag given there again wins: the last one counts).
#   --decode_threads  the container's CPU limit (downward API limits.cpu,
#                     rounded up to whole CPUs), not the host's core count
#   --memory_budget   TUTTI_SHM_PERCENT (default 75) of the container's memory
#                     limit: batch segments are charged to this container, the
#                     rest is the daemon's own working memory
#   --cache_capacity  TUTTI_CACHE_PERCENT (default 90) of the space the cache may
#                     use: the cache volume's free space plus what the cache
#                     directory already holds (a restarted stager keeps its
#                     shards), not the volume's size, part of which other jobs'
#                     caches or other files may hold; jobs that share a node's
#                     NVMe split it between them
# With TUTTI_NODES_FILE (the job's locality, overlays/locality): the job's
# nodes in node order, one a line, "NODE_NAME [ADDRESS]" (ADDRESS defaults to
# the name; '#' starts a comment). This pod's node (NODE_NAME, from
# spec.nodeName) at line i (from 0) gets --node=i in place of the manifest's
# --node=auto, --peer_listen=0.0.0.0:TUTTI_PEER_PORT (default 7072) and
# --peers=0=ADDRESS0:PORT,1=...; a node not in the file keeps --node=auto and
# gets no peers (its ranks' remote members then come from the source).
set -eu
cpus=${TUTTI_CPU_LIMIT:?set from resourceFieldRef limits.cpu}
memory_mib=${TUTTI_MEMORY_LIMIT_MIB:?set from resourceFieldRef limits.memory, divisor 1Mi}
shm_percent=${TUTTI_SHM_PERCENT:-75}
cache_percent=${TUTTI_CACHE_PERCENT:-90}
cache_dir=${TUTTI_CACHE_DIR:-/cache}
for v in "$cpus" "$memory_mib" "$shm_percent" "$cache_percent"; do
  case "$v" in '' | *[!0-9]*) echo "stagerd.sh: '$v' is not a whole number" >&2; exit 2 ;; esac
done
if [ "$shm_percent" -lt 1 ] || [ "$shm_percent" -gt 95 ] || [ "$cache_percent" -lt 1 ] ||
   [ "$cache_percent" -gt 100 ]; then
  echo "stagerd.sh: TUTTI_SHM_PERCENT must be 1..95 and TUTTI_CACHE_PERCENT 1..100" >&2
  exit 2
fi
free_kib=$(df -Pk "$cache_dir" | awk 'NR == 2 { print $4 }')
held_kib=$(du -sk "$cache_dir" 2>/dev/null | awk 'NR == 1 { print $1 }')
for v in "$free_kib" "$held_kib"; do
  case "$v" in '' | *[!0-9]*) echo "stagerd.sh: cannot size $cache_dir" >&2; exit 1 ;; esac
done
cache_kib=$((free_kib + held_kib))
if [ -n "${TUTTI_NODES_FILE:-}" ]; then
  peer_port=${TUTTI_PEER_PORT:-7072}
  case "$peer_port" in '' | *[!0-9]*) echo "stagerd.sh: TUTTI_PEER_PORT '$peer_port' is not a port" >&2; exit 2 ;; esac
  node_name=${NODE_NAME:?set from fieldRef spec.nodeName}
  [ -r "$TUTTI_NODES_FILE" ] || { echo "stagerd.sh: cannot read $TUTTI_NODES_FILE" >&2; exit 1; }
  peers=$(sed 's/#.*//' "$TUTTI_NODES_FILE" | awk -v port="$peer_port" '
    NF == 0 { next }
    { addr = NF > 1 ? $2 : $1; printf "%s%d=%s:%s", (n ? "," : ""), n, addr, port; n++ }')
  node=$(sed 's/#.*//' "$TUTTI_NODES_FILE" | awk -v name="$node_name" '
    NF == 0 { next }
    $1 == name { print n + 0; exit }
    { n++ }')
  if [ -z "$node" ]; then
    echo "stagerd.sh: node $node_name is not in $TUTTI_NODES_FILE: no peers, --node as given" >&2
  else
    # The manifest's --node=auto gives way to the node's line.
    for a in "$@"; do
      shift
      [ "$a" = --node=auto ] || set -- "$@" "$a"
    done
    set -- --node="$node" --peer_listen="0.0.0.0:$peer_port" --peers="$peers" "$@"
  fi
fi
exec "${TUTTI_STAGERD:-/opt/tutti/bin/tutti-stagerd}" \
  --decode_threads="$cpus" \
  --memory_budget="$((memory_mib * shm_percent / 100))M" \
  --cache_capacity="$((cache_kib / 1024 * cache_percent / 100))M" \
  "$@"
