from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PEER_STATE_UNSPECIFIED: _ClassVar[PeerState]
    PEER_STATE_JOINING: _ClassVar[PeerState]
    PEER_STATE_TRAINING: _ClassVar[PeerState]
    PEER_STATE_AVERAGING: _ClassVar[PeerState]
    PEER_STATE_STOPPING: _ClassVar[PeerState]
    PEER_STATE_SERVING: _ClassVar[PeerState]

class Reachability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REACHABILITY_UNKNOWN: _ClassVar[Reachability]
    REACHABILITY_REACHABLE: _ClassVar[Reachability]
    REACHABILITY_UNREACHABLE: _ClassVar[Reachability]

class PayloadKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAYLOAD_KIND_UNSPECIFIED: _ClassVar[PayloadKind]
    PAYLOAD_KIND_BLOCK_DELTA: _ClassVar[PayloadKind]
    PAYLOAD_KIND_EMBEDDING_DELTA: _ClassVar[PayloadKind]
    PAYLOAD_KIND_BLOCK_STATE: _ClassVar[PayloadKind]
    PAYLOAD_KIND_EMBEDDING_STATE: _ClassVar[PayloadKind]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_FP32: _ClassVar[Codec]
    CODEC_FP16: _ClassVar[Codec]
    CODEC_BF16: _ClassVar[Codec]
    CODEC_INT8: _ClassVar[Codec]
PEER_STATE_UNSPECIFIED: PeerState
PEER_STATE_JOINING: PeerState
PEER_STATE_TRAINING: PeerState
PEER_STATE_AVERAGING: PeerState
PEER_STATE_STOPPING: PeerState
PEER_STATE_SERVING: PeerState
REACHABILITY_UNKNOWN: Reachability
REACHABILITY_REACHABLE: Reachability
REACHABILITY_UNREACHABLE: Reachability
PAYLOAD_KIND_UNSPECIFIED: PayloadKind
PAYLOAD_KIND_BLOCK_DELTA: PayloadKind
PAYLOAD_KIND_EMBEDDING_DELTA: PayloadKind
PAYLOAD_KIND_BLOCK_STATE: PayloadKind
PAYLOAD_KIND_EMBEDDING_STATE: PayloadKind
CODEC_UNSPECIFIED: Codec
CODEC_FP32: Codec
CODEC_FP16: Codec
CODEC_BF16: Codec
CODEC_INT8: Codec

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SwarmConfig(_message.Message):
    __slots__ = ("swarm_id", "model_config_json", "config_hash", "protocol")
    SWARM_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    swarm_id: str
    model_config_json: str
    config_hash: str
    protocol: str
    def __init__(self, swarm_id: _Optional[str] = ..., model_config_json: _Optional[str] = ..., config_hash: _Optional[str] = ..., protocol: _Optional[str] = ...) -> None: ...

class PeerStatus(_message.Message):
    __slots__ = ("peer_id", "block_index", "state", "round", "local_steps", "samples_per_s", "last_ce", "bytes_sent", "bytes_received", "participation", "uptime_s", "address", "swarm_id", "config_hash", "consensus_distance", "base_hash", "multiaddrs", "client_mode", "raw_bytes_sent", "last_round_s", "sketch", "param_norm", "emb_hash", "train_ce", "signed_record", "reachability", "reachability_detail")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LAST_CE_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PARTICIPATION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SWARM_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    CONSENSUS_DISTANCE_FIELD_NUMBER: _ClassVar[int]
    BASE_HASH_FIELD_NUMBER: _ClassVar[int]
    MULTIADDRS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_MODE_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_S_FIELD_NUMBER: _ClassVar[int]
    SKETCH_FIELD_NUMBER: _ClassVar[int]
    PARAM_NORM_FIELD_NUMBER: _ClassVar[int]
    EMB_HASH_FIELD_NUMBER: _ClassVar[int]
    TRAIN_CE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_RECORD_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_DETAIL_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    block_index: int
    state: PeerState
    round: int
    local_steps: int
    samples_per_s: float
    last_ce: float
    bytes_sent: int
    bytes_received: int
    participation: float
    uptime_s: float
    address: str
    swarm_id: str
    config_hash: str
    consensus_distance: float
    base_hash: str
    multiaddrs: _containers.RepeatedScalarFieldContainer[str]
    client_mode: bool
    raw_bytes_sent: int
    last_round_s: float
    sketch: _containers.RepeatedScalarFieldContainer[float]
    param_norm: float
    emb_hash: str
    train_ce: float
    signed_record: str
    reachability: Reachability
    reachability_detail: str
    def __init__(self, peer_id: _Optional[str] = ..., block_index: _Optional[int] = ..., state: _Optional[_Union[PeerState, str]] = ..., round: _Optional[int] = ..., local_steps: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., last_ce: _Optional[float] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., participation: _Optional[float] = ..., uptime_s: _Optional[float] = ..., address: _Optional[str] = ..., swarm_id: _Optional[str] = ..., config_hash: _Optional[str] = ..., consensus_distance: _Optional[float] = ..., base_hash: _Optional[str] = ..., multiaddrs: _Optional[_Iterable[str]] = ..., client_mode: _Optional[bool] = ..., raw_bytes_sent: _Optional[int] = ..., last_round_s: _Optional[float] = ..., sketch: _Optional[_Iterable[float]] = ..., param_norm: _Optional[float] = ..., emb_hash: _Optional[str] = ..., train_ce: _Optional[float] = ..., signed_record: _Optional[str] = ..., reachability: _Optional[_Union[Reachability, str]] = ..., reachability_detail: _Optional[str] = ...) -> None: ...

class PullStateRequest(_message.Message):
    __slots__ = ("swarm_id", "config_hash", "kind", "block_index", "outer_state", "current", "working", "weights_hash", "compact", "against", "min_round")
    SWARM_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    OUTER_STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    WORKING_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_HASH_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    AGAINST_FIELD_NUMBER: _ClassVar[int]
    MIN_ROUND_FIELD_NUMBER: _ClassVar[int]
    swarm_id: str
    config_hash: str
    kind: PayloadKind
    block_index: int
    outer_state: bool
    current: bool
    working: bool
    weights_hash: str
    compact: bool
    against: str
    min_round: int
    def __init__(self, swarm_id: _Optional[str] = ..., config_hash: _Optional[str] = ..., kind: _Optional[_Union[PayloadKind, str]] = ..., block_index: _Optional[int] = ..., outer_state: _Optional[bool] = ..., current: _Optional[bool] = ..., working: _Optional[bool] = ..., weights_hash: _Optional[str] = ..., compact: _Optional[bool] = ..., against: _Optional[str] = ..., min_round: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ...) -> None: ...

class PayloadHeader(_message.Message):
    __slots__ = ("swarm_id", "config_hash", "kind", "block_index", "round", "base_hash", "codec", "tensors", "raw_bytes", "payload_bytes", "weight", "peer_id", "zstd", "signature", "phase")
    SWARM_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BASE_HASH_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    swarm_id: str
    config_hash: str
    kind: PayloadKind
    block_index: int
    round: int
    base_hash: str
    codec: Codec
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    raw_bytes: int
    payload_bytes: int
    weight: float
    peer_id: str
    zstd: bool
    signature: bytes
    phase: int
    def __init__(self, swarm_id: _Optional[str] = ..., config_hash: _Optional[str] = ..., kind: _Optional[_Union[PayloadKind, str]] = ..., block_index: _Optional[int] = ..., round: _Optional[int] = ..., base_hash: _Optional[str] = ..., codec: _Optional[_Union[Codec, str]] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., raw_bytes: _Optional[int] = ..., payload_bytes: _Optional[int] = ..., weight: _Optional[float] = ..., peer_id: _Optional[str] = ..., zstd: _Optional[bool] = ..., signature: _Optional[bytes] = ..., phase: _Optional[int] = ...) -> None: ...

class PayloadEnd(_message.Message):
    __slots__ = ("sha256",)
    SHA256_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    def __init__(self, sha256: _Optional[str] = ...) -> None: ...

class Payload(_message.Message):
    __slots__ = ("header", "chunk", "end", "reject")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    header: PayloadHeader
    chunk: bytes
    end: PayloadEnd
    reject: str
    def __init__(self, header: _Optional[_Union[PayloadHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., end: _Optional[_Union[PayloadEnd, _Mapping]] = ..., reject: _Optional[str] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "zstd")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    zstd: bool
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., zstd: _Optional[bool] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("session_id", "block_index", "config_hash", "context", "z", "sigma", "sigma_next", "final", "start_position", "use_cache", "end_session", "step_index", "message")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    SIGMA_NEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    USE_CACHE_FIELD_NUMBER: _ClassVar[int]
    END_SESSION_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    block_index: int
    config_hash: str
    context: Tensor
    z: Tensor
    sigma: float
    sigma_next: float
    final: bool
    start_position: int
    use_cache: bool
    end_session: bool
    step_index: int
    message: Tensor
    def __init__(self, session_id: _Optional[str] = ..., block_index: _Optional[int] = ..., config_hash: _Optional[str] = ..., context: _Optional[_Union[Tensor, _Mapping]] = ..., z: _Optional[_Union[Tensor, _Mapping]] = ..., sigma: _Optional[float] = ..., sigma_next: _Optional[float] = ..., final: _Optional[bool] = ..., start_position: _Optional[int] = ..., use_cache: _Optional[bool] = ..., end_session: _Optional[bool] = ..., step_index: _Optional[int] = ..., message: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ForwardReply(_message.Message):
    __slots__ = ("z", "logits", "compute_s", "peer_id", "message", "block_hash", "emb_hash")
    Z_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    EMB_HASH_FIELD_NUMBER: _ClassVar[int]
    z: Tensor
    logits: Tensor
    compute_s: float
    peer_id: str
    message: Tensor
    block_hash: str
    emb_hash: str
    def __init__(self, z: _Optional[_Union[Tensor, _Mapping]] = ..., logits: _Optional[_Union[Tensor, _Mapping]] = ..., compute_s: _Optional[float] = ..., peer_id: _Optional[str] = ..., message: _Optional[_Union[Tensor, _Mapping]] = ..., block_hash: _Optional[str] = ..., emb_hash: _Optional[str] = ...) -> None: ...

class DialBackRequest(_message.Message):
    __slots__ = ("port", "peer_id", "tls_fingerprint")
    PORT_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    TLS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    port: int
    peer_id: str
    tls_fingerprint: str
    def __init__(self, port: _Optional[int] = ..., peer_id: _Optional[str] = ..., tls_fingerprint: _Optional[str] = ...) -> None: ...

class DialBackReply(_message.Message):
    __slots__ = ("reachable", "dialled", "reason")
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    DIALLED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    reachable: bool
    dialled: str
    reason: str
    def __init__(self, reachable: _Optional[bool] = ..., dialled: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
