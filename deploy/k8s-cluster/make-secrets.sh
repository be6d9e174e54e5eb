#!/bin/sh
# Writes the secrets the cluster overlay's secretGenerator reads
# (kustomization.yaml), each random and readable by you only, unless they
# exist already (every node must keep the same cluster key: rerunning this
# never replaces one). They stay out of git (secrets/.gitignore).
#   secrets/cluster.key      48 random bytes: the peers' HMAC handshake key
#   secrets/redis-admin.pass Redis `requirepass` (the default user: admin)
#   secrets/redis-tierkvd.pass  the ACL user tierkvd (directory keys only)
# Usage: deploy/k8s-cluster/make-secrets.sh [DIR]   (default: next to it)
set -eu
dir=${1:-$(dirname "$0")/secrets}
mkdir -p "$dir"
umask 077
# head -c of /dev/urandom; base64 for the passwords (one line, no spaces:
# they go into redis.conf).
[ -e "$dir/cluster.key" ] || head -c 48 /dev/urandom > "$dir/cluster.key"
for f in redis-admin.pass redis-tierkvd.pass; do
  [ -e "$dir/$f" ] || head -c 32 /dev/urandom | base64 | tr -d '\n=' > "$dir/$f"
done
ls -l "$dir"
