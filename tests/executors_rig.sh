#!/usr/bin/env bash
# The executors' end-to-end rig (docs/executors.md): a docker daemon on a private socket with a Debian image built
# offline, and an sshd on 127.0.0.1 with a throwaway user and key, all under .e2e/executors. Needs root (dockerd,
# useradd). `start` makes and starts what is missing; `stop` stops both and removes the user.
#   tests/executors_rig.sh start|stop
set -euo pipefail
cd "$(dirname "$0")/.."
rig="$PWD/.e2e/executors"
image="chb-e2e:bookworm"
cache="${HOME}/.cache/claude-hermes-bridge-e2e"  # the image's root file system, kept between clean clones

start_docker() {
  local sock="$rig/docker/docker.sock"
  mkdir -p "$rig/docker"
  if ! DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1; then
    # No bridge and no iptables: nothing of the machine's network changes, and two rigs never collide.
    setsid dockerd --host "unix://$sock" --data-root "$rig/docker/data" --exec-root "$rig/docker/exec" \
      --pidfile "$rig/docker/dockerd.pid" --bridge none --iptables=false --ip-masq=false \
      > "$rig/docker/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 1 100); do DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  DOCKER_HOST="unix://$sock" docker version --format 'docker daemon {{.Server.Version}}' \
    || { tail -20 "$rig/docker/dockerd.log"; exit 1; }
  if ! DOCKER_HOST="unix://$sock" docker image inspect "$image" >/dev/null 2>&1; then
    if [ ! -s "$cache/bookworm-min.tar" ]; then
      mkdir -p "$cache"
      rm -rf "$cache/root"
      debootstrap --variant=minbase --include=git bookworm "$cache/root" http://deb.debian.org/debian \
        > "$rig/debootstrap.log" 2>&1 || { tail -20 "$rig/debootstrap.log"; exit 1; }
      tar -C "$cache/root" -cf "$cache/bookworm-min.tar.partial" . && mv "$cache/bookworm-min.tar.partial" "$cache/bookworm-min.tar"
      rm -rf "$cache/root"
    fi
    DOCKER_HOST="unix://$sock" docker import "$cache/bookworm-min.tar" "$image" >/dev/null
  fi
  echo "docker: unix://$sock with $image"
}

start_sshd() {
  mkdir -p "$rig/sshd"
  local user
  if [ -s "$rig/sshd/user" ]; then user=$(cat "$rig/sshd/user"); else user="chb$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"; fi
  if ! id "$user" >/dev/null 2>&1; then
    useradd --create-home --home-dir "$rig/sshd/home" --shell /bin/bash "$user"
    chown -R "$user:" "$rig/sshd/home"  # a home left by an earlier rig's user (another uid) becomes this one's
    usermod -p '*' "$user"  # no password, not locked: sshd refuses a locked account
    echo "$user" > "$rig/sshd/user"
  fi
  [ -s "$rig/sshd/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$rig/sshd/id_ed25519"
  [ -s "$rig/sshd/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$rig/sshd/host_ed25519"
  cp "$rig/sshd/id_ed25519.pub" "$rig/sshd/authorized_keys"
  chmod 644 "$rig/sshd/authorized_keys"
  if [ -s "$rig/sshd/sshd.pid" ] && kill -0 "$(cat "$rig/sshd/sshd.pid")" 2>/dev/null; then
    echo "sshd: already on 127.0.0.1 port $(cat "$rig/sshd/port") as $user"; return
  fi
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p /run/sshd
  cat > "$rig/sshd/sshd_config" <<CONFIG
ListenAddress 127.0.0.1
Port $port
HostKey $rig/sshd/host_ed25519
PidFile $rig/sshd/sshd.pid
AuthorizedKeysFile $rig/sshd/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowUsers $user
Subsystem sftp internal-sftp
CONFIG
  echo "$port" > "$rig/sshd/port"
  /usr/sbin/sshd -f "$rig/sshd/sshd_config" -E "$rig/sshd/sshd.log"
  echo "sshd: 127.0.0.1 port $port as $user"
}

stop_all() {
  for pidfile in "$rig/docker/dockerd.pid" "$rig/sshd/sshd.pid"; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  if [ -s "$rig/sshd/user" ]; then userdel "$(cat "$rig/sshd/user")" 2>/dev/null || true; rm -f "$rig/sshd/user"; fi
}

case "${1:-}" in
  start) start_docker; start_sshd ;;
  stop) stop_all ;;
  *) echo "usage: $0 start|stop"; exit 2 ;;
esac
