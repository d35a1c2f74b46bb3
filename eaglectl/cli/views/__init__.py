"""The human views of every command's result, one renderer per result type (the JSON form is the result's own
`to_json`). They draw on cli/console.py; cli/report.py picks the view when a command finishes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checkpoints import (
    batch_item,
    render_batch,
    render_check,
    render_conversion,
    render_diff,
    render_family,
    render_in_target,
    render_inspect,
    render_upgrade,
    render_upload,
)
from .measurements import render_capture, render_drift, render_smoke, render_verify

# Keyed by the result's class name: the classes are imported for annotations only (verify's brings torch, and
# `eaglectl --help` never imports it).
RENDERERS: dict[str, Callable[[Any], None]] = {
    "InspectReport": render_inspect, "ParityReport": render_verify, "ConversionResult": render_conversion,
    "UpgradeResult": render_upgrade, "SmokeReport": render_smoke, "CheckReport": render_check,
    "CaptureResult": render_capture, "DriftReport": render_drift, "DiffReport": render_diff,
    "UploadReport": render_upload, "FamilyReport": render_family, "InTargetReport": render_in_target,
}

__all__ = ["RENDERERS", "batch_item", "render_batch", "render_capture", "render_check", "render_conversion",
           "render_diff", "render_drift", "render_family", "render_in_target", "render_inspect", "render_smoke",
           "render_upgrade", "render_upload", "render_verify"]
