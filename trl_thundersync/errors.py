"""Typed exceptions. Every failure a user can cause or meet has its own class and a message naming the problem."""

from __future__ import annotations


class ThunderSyncError(RuntimeError):
    """Base class of every error raised by trl_thundersync at run time."""


class ConfigurationError(ValueError):
    """A config field holds a value ThunderSync refuses (the message names the field, the value and the fix)."""


class UnsupportedOptionError(ConfigurationError):
    """A TRL option that cannot be streamed exactly; refused at construction instead of approximated."""


class StalePolicyError(ThunderSyncError):
    """A trajectory was sampled with a policy version other than the one the learner is accumulating (invariant 1)."""


class RewardFunctionError(ThunderSyncError):
    """A reward function raised, or returned the wrong number or type of values."""


class RewardScopeError(RewardFunctionError):
    """Under reward_scope="auto", a reward function gave different values called per trajectory than called once on
    its group: it reads the other completions of its call, so it needs reward_scope="group" or "batch"."""


class UnscorableGroupError(ThunderSyncError):
    """Every reward function returned None for every member of a group: the group carries no learning signal."""


class NonFiniteGradientError(ThunderSyncError):
    """NaN or inf reached a log-probability or the batch direction; the optimizer step is refused."""


class RolloutError(ThunderSyncError):
    """The rollout engine failed, returned a malformed trajectory, or lost a trajectory of the open batch."""


class DeadEngineError(RolloutError):
    """A vLLM server answered that its engine core died (HTTP 500 `EngineCore encountered an issue`): the server will
    not answer again (it exits), so the batch fails at once instead of waiting for a restart; the root cause is the
    first error in the server's log."""


class AbortedSampleError(RolloutError):
    """A server answered a sample with `finish_reason` "abort" or "error": it was cut short (an abort, a `/pause`, a
    failure in the engine) and is not the policy's sample, so it is refused, never trained on."""


class UnknownEnvironmentError(RolloutError, ValueError):
    """A dataset row's `environment` names no factory of the `environment_factory` dict. A `ValueError` too, with
    trl.GRPOTrainer's message, so code written for TRL catches it the same way."""


class BatchIncompleteError(ThunderSyncError):
    """The barrier was reached while a registered trajectory or group of the batch had not closed."""


class TeacherScoringError(ThunderSyncError):
    """The teacher returned too few or too many log-probabilities for a turn, NaN/inf scores, or failed to answer."""


class VocabularyMismatchError(ConfigurationError):
    """Teacher and student do not share a tokenizer/vocabulary, so teacher scores of student tokens mean nothing."""


class NoScoredTokensError(ThunderSyncError):
    """A logical distillation batch closed with zero scored action tokens: Eq. 9's normalizer N_k would be 0."""


class TurnOrderError(ThunderSyncError):
    """A turn's context does not extend its trajectory's previous turn (the token history was rewritten)."""


class PrefixMismatchError(ThunderSyncError):
    """A group member's tokens do not start with the group's shared prefix (a prompt rewritten or rendered differently
    per member): that member's pass must run over its whole sequence instead."""


class TraceInUseError(ConfigurationError):
    """Another live run writes the step trace in this output_dir (two trainers sharing one output_dir at once)."""


class PeerProcessError(ThunderSyncError):
    """Another learner process of the job failed, so this one stops too instead of stepping without its share or
    waiting in a collective that will not complete; the message names the failed process and its cause (raised at a
    streamed batch's exchange of shares, or by `trainers/rank_failure.py` when a peer posted its failure)."""


class AdapterLoadError(RolloutError):
    """A rollout server refused `/v1/load_lora_adapter`. `kind` tells why: "route absent" (the server was started
    without runtime LoRA loading), "path unreadable" (the server cannot open `lora_path` on its own filesystem),
    "duplicate name" (the name is loaded already) or "refused" (anything else); `server_message` is its own text."""

    def __init__(self, message: str, *, url: str, adapter: str, kind: str, server_message: str) -> None:
        super().__init__(message)
        self.url, self.adapter, self.kind, self.server_message = url, adapter, kind, server_message


class ReplicaRestartedError(StalePolicyError):
    """Before a batch, a rollout replica no longer confirms the weight version it acknowledged (it restarted and
    serves its checkpoint weights, or another trainer published to it), and that version could not be put back."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class ServerBaseWeightsError(StalePolicyError):
    """A LoRA publication found a rollout server whose base weights are not the checkpoint it was started with: its
    `/weight_info` label (`label`) names a full-weight publication (another run's `policy-<run>-v<k>`), so adapters
    trained on the policy's base would sample from other weights."""

    def __init__(self, message: str, *, url: str, label: str) -> None:
        super().__init__(message)
        self.url, self.label = url, label


class UnknownLossTypeError(ConfigurationError):
    """`loss_type` names no entry of the loss-type table (`streaming/loss_types.py`); the message lists the
    supported ones."""


class MemoryPlanError(ConfigurationError):
    """The run's memory plan cannot fit its budget or the memory available, or the model changed after the plan
    (`trl_thundersync.memory`); the message names the fields that would make it fit."""
