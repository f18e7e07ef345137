"""Middle frames of videos: what create_ucf101 / create_k700 turn each clip into (CLIP's
protocol: one image per clip). Decoding needs PyAV (``pip install av``)."""

from __future__ import annotations

from typing import Any

from _dataset_files import ScriptError


def _av() -> Any:
    try:
        import av
    except ImportError as err:
        raise ScriptError("decoding the videos needs PyAV: pip install av") from err
    return av


def middle_frame(path: str) -> Any:
    """The middle frame of the video at ``path`` as a PIL image, or None without video.

    The frame count comes from the stream's header when it has one, else from a first pass.
    """
    av = _av()
    try:
        with av.open(path) as container:
            if not container.streams.video:
                return None
            count = container.streams.video[0].frames
            if count <= 0:
                count = sum(1 for _ in container.decode(video=0))
                container.seek(0)
            for i, frame in enumerate(container.decode(video=0)):
                if i == count // 2:
                    return frame.to_image()
    except av.error.FFmpegError as err:
        raise ScriptError(f"cannot decode {path}: {err}") from err
    return None


def frame_of(path: str) -> Any:
    """A deferred :func:`middle_frame` (``Sample.source``), looked up when called so that the
    decoder can be replaced."""
    import _video

    return lambda: _video.middle_frame(path)
