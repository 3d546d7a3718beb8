"""Built-in logger destinations, one per module; heavy dependencies load lazily."""

from __future__ import annotations

from trainbus.loggers.console import ConsoleLogger as ConsoleLogger
from trainbus.loggers.http_uploader import HTTPMetricsUploader as HTTPMetricsUploader
from trainbus.loggers.http_uploader import MetricsUploadStatistics as MetricsUploadStatistics
from trainbus.loggers.http_uploader import MetricsUploadWarning as MetricsUploadWarning
from trainbus.loggers.http_uploader import UploaderStatistics as UploaderStatistics
from trainbus.loggers.in_memory import InMemoryLogger as InMemoryLogger
from trainbus.loggers.jsonl import JSONLinesLogger as JSONLinesLogger
from trainbus.loggers.mlflow import MLflowLogger as MLflowLogger
from trainbus.loggers.mlflow import TrackingServerError as TrackingServerError
from trainbus.loggers.tensorboard import TensorBoardLogger as TensorBoardLogger
from trainbus.loggers.wandb_logger import WandBLogger as WandBLogger

__all__ = (
    "ConsoleLogger",
    "HTTPMetricsUploader",
    "InMemoryLogger",
    "JSONLinesLogger",
    "MLflowLogger",
    "MetricsUploadWarning",
    "TensorBoardLogger",
    "TrackingServerError",
    "MetricsUploadStatistics",
    "UploaderStatistics",
    "WandBLogger",
)
