# shellcheck shell=bash
# Shared helpers of the cluster tests in hack/test (sourced). Set TEST_NAME and KUBECONFIG_FILE first;
# BIN_DIR defaults to $CACHE_DIR/bin.
BIN_DIR="${BIN_DIR:-$CACHE_DIR/bin}"
results=()
failed=0

pass() { results+=("PASS  $*"); echo "$TEST_NAME: PASS  $*"; }
fail() {
  results+=("FAIL  $*")
  echo "$TEST_NAME: FAIL  $*" >&2
  failed=1
}

k() { "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# wait_until SECONDS CMD...: poll CMD until it succeeds; non-zero on timeout.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

# free_port_base FROM PREFIX: the first port base from FROM up (steps of 1000) whose cluster ports are
# free and whose state folder .cluster/PREFIX-<base> does not exist; $SMOKE_PORT_BASE when set.
free_port_base() {
  local base off busy
  if [[ -n "${SMOKE_PORT_BASE:-}" ]]; then echo "$SMOKE_PORT_BASE" && return; fi
  for base in $(seq "$1" 1000 $(($1 + 19000))); do
    busy=0
    for off in 379 380 443 257 259; do
      ss -Htln "sport = :$((base + off))" | grep -q . && busy=1
    done
    if ((busy == 0)) && [[ ! -e "$REPO_DIR/.cluster/$2-$base" ]]; then echo "$base" && return; fi
  done
  echo "$TEST_NAME: FAIL  no free port range found from $1" >&2
  return 1
}

# summary TITLE: the results, one a line, and the verdict.
summary() {
  echo
  echo "================ $1 ================"
  printf '%s\n' "${results[@]}"
  if ((failed)); then echo "RESULT: FAIL (cluster logs kept in ${KEEP_LOGS:-$REPO_DIR/.cluster/$TEST_NAME-logs})"; else echo "RESULT: PASS"; fi
  echo "======================================================"
}

# finish_cluster_test RC TITLE CLEAN [LEFTOVERS]: the end of a cluster test, from its EXIT trap with
# the exit code RC. Keeps the logs of a failed run (and $EVENTS, when set) in
# .cluster/$TEST_NAME-logs, takes the cluster down, fails if a process of it is still alive or if the
# command LEFTOVERS prints anything (what the host still holds), else passes "down in Ns: CLEAN";
# then removes the state, prints the summary and exits.
finish_cluster_test() {
  local rc=$1 title=$2 clean=$3 leftovers=${4:-}
  ((rc == 0 || failed)) || fail "aborted with exit code $rc (see the output above)"
  local keep="$REPO_DIR/.cluster/$TEST_NAME-logs"
  if ((failed)) && [[ -d "$CLUSTER_DIR/logs" ]]; then
    rm -rf "$keep"
    cp -r "$CLUSTER_DIR/logs" "$keep"
    [[ -n "${EVENTS:-}" && -f "${EVENTS:-}" ]] && cp "$EVENTS" "$keep/"
  fi
  local pids=() t0=$SECONDS
  [[ -d "$CLUSTER_DIR/pids" ]] && mapfile -t pids < <(cat "$CLUSTER_DIR"/pids/*.pid 2>/dev/null)
  if "$HACK_DIR/cluster" down; then
    local p alive=() left=""
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    [[ -z "$leftovers" ]] || left="$("$leftovers")"
    if ((${#alive[@]})); then
      fail "down left processes running: ${alive[*]}"
    elif [[ -n "$left" ]]; then
      fail "down left host state behind: $left"
    else
      pass "down in $((SECONDS - t0))s: $clean"
    fi
  else
    fail "hack/cluster down reported an error"
  fi
  rm -rf "$CLUSTER_DIR"
  summary "$title"
  ((failed == 0)) || exit 1
  exit 0
}

# finish_suite RC TITLE: the end of a cluster test that ran on a shared cluster (SHARED_CLUSTER=1),
# from its EXIT trap after it removed what it made: the summary and the verdict; the cluster stays up.
finish_suite() {
  local rc=$1
  ((rc == 0 || failed)) || fail "aborted with exit code $rc (see the output above)"
  if ((failed)) && [[ -n "${EVENTS:-}" && -f "${EVENTS:-}" ]]; then cp "$EVENTS" "$CLUSTER_DIR/logs/" 2>/dev/null || true; fi
  summary "$2"
  ((failed == 0)) || exit 1
  exit 0
}
