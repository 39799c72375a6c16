#!/bin/sh
# Entrypoint of every Prime Swarm image.
#
# 1. If SWARM_ENV_FILE is set, wait for that file (written by the one-shot deployer into the
#    shared chain volume) and export its KEY=VALUE lines: the ledger address, pool id and trainer
#    address exist only once the deployer has run. Variables already set in the container's
#    environment win over the file.
# 2. If SWARM_REDIS_PASSWORD_FILE is set (a compose secret), put that password into every
#    PRIME_*_REDIS_URL naming a user, redis://USER@HOST:PORT/DB -> redis://USER:PASSWORD@...,
#    and the same for redis+sentinel://USER@HOST:PORT,...:PORT/SERVICE/DB (docker-compose.ha.yml:
#    the password is the data nodes'; the Sentinels are asked without one): compose's
#    `environment:` shows in `docker inspect`, so it holds the user, never the password.
# 3. Run the given command, or this image's service when none is given.
set -eu

if [ -n "${SWARM_ENV_FILE:-}" ]; then
    waited=0
    limit="${SWARM_ENV_WAIT_S:-300}"
    while [ ! -s "$SWARM_ENV_FILE" ]; do
        if [ "$waited" -ge "$limit" ]; then
            echo "prime-entrypoint: $SWARM_ENV_FILE did not appear within ${limit}s" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            '' | '#'*) continue ;;
        esac
        key=${line%%=*}
        case "$key" in
            *[!A-Za-z0-9_]* | [0-9]*) echo "prime-entrypoint: bad line in $SWARM_ENV_FILE" >&2; exit 1 ;;
        esac
        eval "already=\${$key+set}"
        if [ -z "$already" ]; then
            export "$line"
        fi
    done < "$SWARM_ENV_FILE"
fi

if [ -n "${SWARM_REDIS_PASSWORD_FILE:-}" ]; then
    password=$(cat "$SWARM_REDIS_PASSWORD_FILE")
    case "$password" in
        # compose-secrets writes URL-safe tokens; anything else would need escaping in a URL.
        '' | *[!A-Za-z0-9_-]*)
            echo "prime-entrypoint: $SWARM_REDIS_PASSWORD_FILE must hold one URL-safe token" >&2
            exit 1 ;;
    esac
    urls=$(env | sed -n 's/^\(PRIME_[A-Z0-9_]*_REDIS_URL\)=.*/\1/p')
    if [ -z "$urls" ]; then
        echo "prime-entrypoint: SWARM_REDIS_PASSWORD_FILE is set but no PRIME_*_REDIS_URL is" >&2
        exit 1
    fi
    for var in $urls; do
        eval "url=\${$var}"
        case "$url" in
            redis://?*@?* | redis+sentinel://?*@?*) ;;
            *) echo "prime-entrypoint: $var must look like redis://USER@HOST:PORT/DB or" \
                    "redis+sentinel://USER@HOST:PORT[,HOST:PORT...]/SERVICE/DB" >&2; exit 1 ;;
        esac
        scheme=${url%%://*}
        rest=${url#*://}
        user=${rest%%@*}
        case "$user" in
            *:* | */*) echo "prime-entrypoint: $var must name a user and no password" >&2; exit 1 ;;
        esac
        export "$var=$scheme://$user:$password@${rest#*@}"
    done
fi

if [ "$#" -eq 0 ]; then
    case "${SWARM_EXTRA:-}" in
        relay) set -- prime-relay relay ;;
        orchestrator) set -- prime-orchestrator ;;
        validator) set -- prime-validator ;;
        trainer) set -- prime-trainer ;;
        worker) set -- prime-worker join ;;
        chain) set -- anvil --host 0.0.0.0 --port 8545 ;;
        *) echo "prime-entrypoint: no command given and SWARM_EXTRA='${SWARM_EXTRA:-}' names no service" >&2; exit 2 ;;
    esac
fi
exec "$@"
