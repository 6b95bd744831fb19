from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TENSOR_DTYPE_UNSPECIFIED: _ClassVar[TensorDtype]
    TENSOR_DTYPE_F32: _ClassVar[TensorDtype]
    TENSOR_DTYPE_BF16: _ClassVar[TensorDtype]

class CollectOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECT_OUTCOME_UNSPECIFIED: _ClassVar[CollectOutcome]
    COLLECT_OUTCOME_APPLIED: _ClassVar[CollectOutcome]
    COLLECT_OUTCOME_EXCLUDED: _ClassVar[CollectOutcome]
    COLLECT_OUTCOME_ROUND_OVER: _ClassVar[CollectOutcome]

class CatchUpOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CATCH_UP_OUTCOME_UNSPECIFIED: _ClassVar[CatchUpOutcome]
    CATCH_UP_OUTCOME_LOADED: _ClassVar[CatchUpOutcome]
    CATCH_UP_OUTCOME_FAILED: _ClassVar[CatchUpOutcome]
TENSOR_DTYPE_UNSPECIFIED: TensorDtype
TENSOR_DTYPE_F32: TensorDtype
TENSOR_DTYPE_BF16: TensorDtype
COLLECT_OUTCOME_UNSPECIFIED: CollectOutcome
COLLECT_OUTCOME_APPLIED: CollectOutcome
COLLECT_OUTCOME_EXCLUDED: CollectOutcome
COLLECT_OUTCOME_ROUND_OVER: CollectOutcome
CATCH_UP_OUTCOME_UNSPECIFIED: CatchUpOutcome
CATCH_UP_OUTCOME_LOADED: CatchUpOutcome
CATCH_UP_OUTCOME_FAILED: CatchUpOutcome

class SharedTensor(_message.Message):
    __slots__ = ("name", "offset", "dtype", "elements")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    dtype: TensorDtype
    elements: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., dtype: _Optional[_Union[TensorDtype, str]] = ..., elements: _Optional[int] = ...) -> None: ...

class TrainerDescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainerJobRanks(_message.Message):
    __slots__ = ("job_id", "mode", "ranks", "replicas")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    mode: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[str] = ..., mode: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class TrainerDescribeResponse(_message.Message):
    __slots__ = ("site_id", "jobs")
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    site_id: str
    jobs: _containers.RepeatedCompositeFieldContainer[TrainerJobRanks]
    def __init__(self, site_id: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[TrainerJobRanks, _Mapping]]] = ...) -> None: ...

class TrainerJoinRequest(_message.Message):
    __slots__ = ("job_id", "rank", "parameters", "pid")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    parameters: int
    pid: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., parameters: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class TrainerJoinResponse(_message.Message):
    __slots__ = ("session", "site_id", "schedule", "session_ttl_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SITE_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    site_id: str
    schedule: TrainerSchedule
    session_ttl_ms: int
    def __init__(self, session: _Optional[str] = ..., site_id: _Optional[str] = ..., schedule: _Optional[_Union[TrainerSchedule, _Mapping]] = ..., session_ttl_ms: _Optional[int] = ...) -> None: ...

class TrainerLeaveRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class TrainerLeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainerScheduleRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class TrainerFragment(_message.Message):
    __slots__ = ("fragment", "first_parameter", "parameters", "sync_at_inner_step", "apply_at_inner_step")
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    FIRST_PARAMETER_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SYNC_AT_INNER_STEP_FIELD_NUMBER: _ClassVar[int]
    APPLY_AT_INNER_STEP_FIELD_NUMBER: _ClassVar[int]
    fragment: int
    first_parameter: int
    parameters: int
    sync_at_inner_step: int
    apply_at_inner_step: int
    def __init__(self, fragment: _Optional[int] = ..., first_parameter: _Optional[int] = ..., parameters: _Optional[int] = ..., sync_at_inner_step: _Optional[int] = ..., apply_at_inner_step: _Optional[int] = ...) -> None: ...

class TrainerSchedule(_message.Message):
    __slots__ = ("job_id", "inner_steps", "overlap_steps", "codec_bits", "fragments", "parameters", "round", "participants", "excluded", "deadline_unix_ms", "last_round_over", "catch_up_after_round", "catch_up_from_site", "serve_after_round", "round_inner_steps", "round_inner_steps_through")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_STEPS_FIELD_NUMBER: _ClassVar[int]
    CODEC_BITS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_OVER_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    SERVE_AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUND_INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    ROUND_INNER_STEPS_THROUGH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    inner_steps: int
    overlap_steps: int
    codec_bits: int
    fragments: _containers.RepeatedCompositeFieldContainer[TrainerFragment]
    parameters: int
    round: int
    participants: _containers.RepeatedScalarFieldContainer[str]
    excluded: bool
    deadline_unix_ms: int
    last_round_over: int
    catch_up_after_round: int
    catch_up_from_site: str
    serve_after_round: int
    round_inner_steps: int
    round_inner_steps_through: int
    def __init__(self, job_id: _Optional[str] = ..., inner_steps: _Optional[int] = ..., overlap_steps: _Optional[int] = ..., codec_bits: _Optional[int] = ..., fragments: _Optional[_Iterable[_Union[TrainerFragment, _Mapping]]] = ..., parameters: _Optional[int] = ..., round: _Optional[int] = ..., participants: _Optional[_Iterable[str]] = ..., excluded: _Optional[bool] = ..., deadline_unix_ms: _Optional[int] = ..., last_round_over: _Optional[int] = ..., catch_up_after_round: _Optional[int] = ..., catch_up_from_site: _Optional[str] = ..., serve_after_round: _Optional[int] = ..., round_inner_steps: _Optional[int] = ..., round_inner_steps_through: _Optional[int] = ...) -> None: ...

class TrainerProgressRequest(_message.Message):
    __slots__ = ("session", "inner_step", "step_seconds")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    INNER_STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session: str
    inner_step: int
    step_seconds: float
    def __init__(self, session: _Optional[str] = ..., inner_step: _Optional[int] = ..., step_seconds: _Optional[float] = ...) -> None: ...

class TrainerSubmitRequest(_message.Message):
    __slots__ = ("session", "round", "fragment", "tensor")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    session: str
    round: int
    fragment: int
    tensor: SharedTensor
    def __init__(self, session: _Optional[str] = ..., round: _Optional[int] = ..., fragment: _Optional[int] = ..., tensor: _Optional[_Union[SharedTensor, _Mapping]] = ...) -> None: ...

class TrainerSubmitResponse(_message.Message):
    __slots__ = ("elements",)
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    elements: int
    def __init__(self, elements: _Optional[int] = ...) -> None: ...

class TrainerCollectRequest(_message.Message):
    __slots__ = ("session", "round", "fragment", "into", "timeout_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    INTO_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    round: int
    fragment: int
    into: SharedTensor
    timeout_ms: int
    def __init__(self, session: _Optional[str] = ..., round: _Optional[int] = ..., fragment: _Optional[int] = ..., into: _Optional[_Union[SharedTensor, _Mapping]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TrainerCollectResponse(_message.Message):
    __slots__ = ("outcome", "hash", "live_sites", "reason")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    LIVE_SITES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    outcome: CollectOutcome
    hash: str
    live_sites: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, outcome: _Optional[_Union[CollectOutcome, str]] = ..., hash: _Optional[str] = ..., live_sites: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class TrainerPublishStateRequest(_message.Message):
    __slots__ = ("session", "round", "tensor")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    session: str
    round: int
    tensor: SharedTensor
    def __init__(self, session: _Optional[str] = ..., round: _Optional[int] = ..., tensor: _Optional[_Union[SharedTensor, _Mapping]] = ...) -> None: ...

class TrainerPublishStateResponse(_message.Message):
    __slots__ = ("elements",)
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    elements: int
    def __init__(self, elements: _Optional[int] = ...) -> None: ...

class TrainerCatchUpRequest(_message.Message):
    __slots__ = ("session", "round", "into", "timeout_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    INTO_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    round: int
    into: SharedTensor
    timeout_ms: int
    def __init__(self, session: _Optional[str] = ..., round: _Optional[int] = ..., into: _Optional[_Union[SharedTensor, _Mapping]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TrainerCatchUpResponse(_message.Message):
    __slots__ = ("outcome", "from_site", "reason")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    outcome: CatchUpOutcome
    from_site: str
    reason: str
    def __init__(self, outcome: _Optional[_Union[CatchUpOutcome, str]] = ..., from_site: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
