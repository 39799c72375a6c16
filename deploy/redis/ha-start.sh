#!/bin/sh
# Starts a Redis data node or a Sentinel of docker-compose.ha.yml, in the redis image (the
# official redis:7, or deploy/docker/infra.Dockerfile's): `ha-start.sh node [redis-server
# options]` or `ha-start.sh sentinel`.
#
# The config is written here, at every start, rather than mounted: both kinds rewrite their
# config file while they run (a Sentinel records what it learns and each failover; a data node
# takes CONFIG REWRITE from the Sentinels when they promote or demote it), so it must be a
# writable file, and it holds a password (masterauth, auth-pass), so it is made 0600 from the
# node's own secret rather than kept in the compose file.
#
# Which node is the primary is the Sentinels' to say, not this container's: a node (or a
# Sentinel) asks the Sentinels first, and only when none answers on the first start of its
# container (the first start of the set: the Sentinels start after `redis`) takes
# REDIS_HA_PRIMARY. A node restarted in the same container waits for an answer
# (REDIS_HA_WAIT_S): coming back as the primary it was before a failover, it would take writes
# the new primary never sees until the Sentinels demoted it.
#
# Environment (docker-compose.ha.yml's x-redis-ha-env):
#   REDIS_HA_NAME            this container's DNS name on `backend` (its compose service)
#   REDIS_HA_PRIMARY         the first primary's DNS name (`redis`)
#   REDIS_HA_SENTINELS       the Sentinels' DNS names, space separated (port 26379)
#   REDIS_HA_SERVICE         the name the Sentinels monitor the primary under (`prime`)
#   REDIS_HA_QUORUM, REDIS_HA_DOWN_AFTER_MS, REDIS_HA_FAILOVER_TIMEOUT_MS
#                            as libs/localnet/redis_ha.py (tests/unit/test_deploy_compose.py
#                            holds the two to the same values)
#   REDIS_HA_USER            the ACL user this one logs in to the data nodes as (`replica`
#                            for a node, `sentinel` for a Sentinel: deploy/redis_acl.py)
#   REDIS_HA_PASSWORD_FILE   that user's password (a compose secret)
#   REDIS_HA_DIR             where the config is written (default /data/ha: the redis image's
#                            /data belongs to its user)
#   REDIS_HA_WAIT_S          how long a restarted node waits for a Sentinel (default 60)
#   REDIS_HA_STARTED         the mark of a start in this container (default /tmp/...: in the
#                            container's own layer, which a restart keeps and a new container
#                            has not)
set -eu

kind=${1:-}
[ "$#" -gt 0 ] && shift
case "$kind" in
    node | sentinel) ;;
    *) echo "ha-start: usage: ha-start.sh node [redis-server options] | sentinel" >&2; exit 2 ;;
esac

for var in REDIS_HA_NAME REDIS_HA_PRIMARY REDIS_HA_SENTINELS REDIS_HA_SERVICE REDIS_HA_USER \
           REDIS_HA_PASSWORD_FILE; do
    eval "value=\${$var:-}"
    if [ -z "$value" ]; then
        echo "ha-start: $var is not set" >&2
        exit 2
    fi
done
password=$(cat "$REDIS_HA_PASSWORD_FILE")
case "$password" in
    # compose-secrets writes URL-safe tokens; anything else could break a config line.
    '' | *[!A-Za-z0-9_-]*)
        echo "ha-start: $REDIS_HA_PASSWORD_FILE must hold one URL-safe token" >&2
        exit 1 ;;
esac

# The primary as the first Sentinel that answers names it (another Sentinel's view when this
# is a Sentinel); empty when none does. `timeout`: a Sentinel whose container is paused or cut
# off must not hold this start.
ask_sentinels() {
    for sentinel in $REDIS_HA_SENTINELS; do
        [ "$sentinel" = "$REDIS_HA_NAME" ] && continue
        answer=$(timeout 3 redis-cli -h "$sentinel" -p 26379 --raw \
            sentinel get-master-addr-by-name "$REDIS_HA_SERVICE" 2>/dev/null | head -n 1) \
            || answer=""
        case "$answer" in
            '' | *ERR* | *' '*) ;;
            *) echo "$answer"; return ;;
        esac
    done
}

started=${REDIS_HA_STARTED:-/tmp/prime-redis-ha.started}
primary=$(ask_sentinels)
if [ -z "$primary" ] && [ "$kind" = node ] && [ -e "$started" ]; then
    echo "ha-start: restarted; waiting for a Sentinel to name the primary" >&2
    waited=0
    while [ -z "$primary" ] && [ "$waited" -lt "${REDIS_HA_WAIT_S:-60}" ]; do
        sleep 1
        waited=$((waited + 1))
        primary=$(ask_sentinels)
    done
fi
if [ -z "$primary" ]; then
    primary=$REDIS_HA_PRIMARY
    echo "ha-start: no Sentinel names a primary; starting with $primary as the primary" >&2
else
    echo "ha-start: the Sentinels name $primary as the primary" >&2
fi
: > "$started"

umask 077
dir=${REDIS_HA_DIR:-/data/ha}
mkdir -p "$dir"
if [ "$kind" = node ]; then
    conf=$dir/redis.conf
    {
        echo "dir /data"
        # A replica (and the old primary, once the Sentinels demote it) logs in to the primary
        # as the replication user: every data node holds this login.
        echo "masteruser $REDIS_HA_USER"
        echo "masterauth $password"
        # Known by its DNS name, not the address it connects from: a container's address may
        # change when it is recreated, and the Sentinels hand this name to the services.
        echo "replica-announce-ip $REDIS_HA_NAME"
        # One replica: nothing to gain by waiting 5 s for others to share a full sync, and
        # until it is done no acknowledgement can be confirmed (libs/streams/replication.py).
        echo "repl-diskless-sync-delay 0"
        if [ "$primary" != "$REDIS_HA_NAME" ]; then
            echo "replicaof $primary 6379"
        fi
    } > "$conf"
    exec redis-server "$conf" "$@"
fi

conf=$dir/sentinel.conf
{
    echo "port 26379"
    # Sentinels hold no password (services ask them without one): they are on `backend` only,
    # which has no route out and no published port. Protected mode would refuse every client
    # not on loopback.
    echo "protected-mode no"
    # Compose gives DNS names, not fixed addresses: resolve them, and hand them out as names.
    echo "sentinel resolve-hostnames yes"
    echo "sentinel announce-hostnames yes"
    echo "sentinel announce-ip $REDIS_HA_NAME"
    echo "sentinel monitor $REDIS_HA_SERVICE $primary 6379 ${REDIS_HA_QUORUM:-2}"
    echo "sentinel down-after-milliseconds $REDIS_HA_SERVICE ${REDIS_HA_DOWN_AFTER_MS:-3000}"
    echo "sentinel failover-timeout $REDIS_HA_SERVICE ${REDIS_HA_FAILOVER_TIMEOUT_MS:-6000}"
    echo "sentinel parallel-syncs $REDIS_HA_SERVICE 1"
    echo "sentinel auth-user $REDIS_HA_SERVICE $REDIS_HA_USER"
    echo "sentinel auth-pass $REDIS_HA_SERVICE $password"
} > "$conf"
exec redis-server "$conf" --sentinel "$@"
