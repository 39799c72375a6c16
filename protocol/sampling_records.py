"""What validators keep in Redis about each worker's sampling, shared among them (their
`validator:*` prefix; libs/rollout/sampling_record.py reads it): per engine and device class,
how often a worker's accepted groups sit near the edge of the replay band, against its peers.

- `SAMPLING_GROUPS`: worker -> accepted groups judged.
- `SAMPLING_MARKED`: worker -> those whose replay z was over `sampling_record.MARGINAL_Z`.

`{kind}` is `sampling_kind(backend, device_class)`: workers whose numbers round alike.
"""

SAMPLING_GROUPS = "validator:sampling:{kind}:groups"
SAMPLING_MARKED = "validator:sampling:{kind}:marked"


def sampling_kind(backend: str, device_class: str) -> str:
    return f"{backend}:{device_class}"
