# Redis, Prometheus and HAProxy for docker-compose.yml (and docker-compose.ha.yml) where no
# registry is reachable (`make images`): the same programs as the redis:7, prom/prometheus and
# haproxy:2.6 images, from Debian bookworm's packages, on a base that deploy/docker/images.py
# makes with debootstrap (no apt inside a build here).
# Each target takes the user and the layout of the image it stands in for, so the compose file
# and the secrets `prime-swarm compose-secrets` chowns work unchanged.
#
#   docker build -f deploy/docker/infra.Dockerfile --target redis -t prime-swarm-redis:bookworm .
#
# On a user's machine compose pulls the official images instead; nothing here is needed.

ARG INFRA_IMAGE=prime-swarm-infra:bookworm

# ------------------------------------------------------------------------------ redis
FROM ${INFRA_IMAGE} AS redis
# uid 999: the official image's `redis` user, the owner compose-secrets gives the ACL file.
RUN mkdir -p /data && chown 999:999 /data
USER 999:999
WORKDIR /data
EXPOSE 6379
CMD ["redis-server"]

# ------------------------------------------------------------------------------ prometheus
FROM ${INFRA_IMAGE} AS prometheus
# nobody, and /prometheus for the TSDB: as in prom/prometheus, so its volume starts writable.
RUN mkdir -p /prometheus /etc/prometheus && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]

# ------------------------------------------------------------------------------ haproxy
FROM ${INFRA_IMAGE} AS haproxy
# uid 99 and the config where the official haproxy image has them: docker-compose.ha.yml mounts
# deploy/haproxy/orchestrators.cfg there, and it reads the same with either image.
RUN mkdir -p /usr/local/etc/haproxy /var/lib/haproxy && chown 99:99 /var/lib/haproxy
USER 99:99
WORKDIR /var/lib/haproxy
# The official image's stop signal: a soft stop, finishing the requests in flight.
STOPSIGNAL SIGUSR1
EXPOSE 8000
CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
