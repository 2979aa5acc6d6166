"""Wire models: Jev's System One format, plus our namespaced extensions. Nothing else declares them.

base          the unknown-field policy (RequestModel, ResponseModel) and Content
questions     POST /v1/systemone, /decide and /decide/batch bodies
answers       their responses, with the ``x_reading`` and ``x_provenance`` extensions
calibrations  /v1/calibrations, /v1/feedback, /v1/calibrations/refit
models        GET /v1/models, the model names accepted, and the error body
openai_decisions  OpenAI's POST /v1/decisions request (imported from there)
openai_answers    its response and error body (imported from there)
"""

from service.protocol.answers import (
    Answer,
    BatchResponse,
    BatchResult,
    CalibrationUsed,
    ChoiceAnswer,
    NoulAnswer,
    PriorUsed,
    Provenance,
    ReadingOut,
    ScoreAnswer,
    SystemOneResponse,
    Usage,
)
from service.protocol.base import BodyModel, Content, RequestModel, ResponseModel
from service.protocol.calibrations import (
    CalibrationExample,
    CalibrationList,
    CalibrationOut,
    CalibrationRequest,
    FeedbackRequest,
    FeedbackResponse,
    RefitRequest,
)
from service.protocol.models import (
    ErrorDetail,
    ErrorResponse,
    ModelCard,
    ModelList,
    ValidationErrorResponse,
    ValidationItem,
)
from service.protocol.questions import (
    MAX_BATCH_READS,
    MAX_BATCH_STATES,
    MAX_LEVELS,
    MAX_OPTIONS,
    MAX_QUESTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    BatchRequest,
    ChoiceQuestion,
    NoulCriteria,
    NoulQuestion,
    Question,
    ScoreQuestion,
    SystemOneRequest,
)

__all__ = [
    "MAX_BATCH_READS",
    "MAX_BATCH_STATES",
    "MAX_LEVELS",
    "MAX_OPTIONS",
    "MAX_QUESTIONS",
    "MIN_LEVELS",
    "MIN_OPTIONS",
    "Answer",
    "BatchRequest",
    "BatchResponse",
    "BatchResult",
    "BodyModel",
    "CalibrationExample",
    "CalibrationList",
    "CalibrationOut",
    "CalibrationRequest",
    "CalibrationUsed",
    "ChoiceAnswer",
    "ChoiceQuestion",
    "Content",
    "ErrorDetail",
    "ErrorResponse",
    "FeedbackRequest",
    "FeedbackResponse",
    "ModelCard",
    "ModelList",
    "NoulAnswer",
    "NoulCriteria",
    "NoulQuestion",
    "PriorUsed",
    "Provenance",
    "Question",
    "ReadingOut",
    "RefitRequest",
    "RequestModel",
    "ResponseModel",
    "ScoreAnswer",
    "ScoreQuestion",
    "SystemOneRequest",
    "SystemOneResponse",
    "Usage",
    "ValidationErrorResponse",
    "ValidationItem",
]
