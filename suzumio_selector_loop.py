"""One thread over an epoll selector that other threads wake through a pipe: the frame of the SSE hub
(suzumio_sse) and of the model loop (suzumio_model_loop). A subclass gives the thread's `name`,
defines its pass (`_step`: select, then work) and what its shut-down ends (`_shut_down`, which closes the
selector and the pipe with `_close_selector` last)."""
import contextlib
import logging
import os
import selectors
import threading

log = logging.getLogger(__name__)


class SelectorLoop:
    """`_lock` guards `_closing`, the thread's start and the pipe; `on_fatal(error)` is called if the
    loop dies (the listener then reports itself down)."""

    name = "suzumio-loop"

    def __init__(self):
        self.on_fatal = None
        self._lock = threading.Lock()
        self._closing = False
        self._thread = None
        self._selector = None
        self._wake_r = self._wake_w = None

    def close(self):
        """Stop the thread (its _shut_down ends what it holds). Idempotent."""
        with self._lock:
            self._closing = True
            thread = self._thread
            self._wake()
        if thread is not None:
            thread.join(timeout=10)

    def _start(self):
        """Under self._lock: the selector, the pipe and the thread."""
        self._selector = selectors.DefaultSelector()  # epoll on Linux: no select() ceiling
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
        self._thread.start()

    def _wake(self):
        """Under self._lock, so that the pipe is never written after _close_selector closed it."""
        if self._wake_w is not None:
            with contextlib.suppress(BlockingIOError):  # a full pipe wakes the loop all the same
                os.write(self._wake_w, b"\0")

    def _woken(self):
        """The loop thread empties the pipe (the selector's key with data None)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _serve(self):
        try:
            while not self._closing:
                self._step()
        except BaseException as error:  # the loop's one boundary: the listener reports it as down
            log.critical("%s died", self.name, exc_info=True)
            if self.on_fatal is not None:
                self.on_fatal(error)
        finally:
            self._shut_down()

    def _shut_down(self):
        self._close_selector()

    def _close_selector(self):
        self._selector.close()
        with self._lock:
            self._closing = True
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = None
