"""MSK events: a poller per partition delivers MSK-shaped batches to the function under the template's error contract
(MskPoller._deliver), and the trigger process that starts them once the broker is there."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import threading
import time

from infra import services
from infra.localrt import events, template
from infra.localrt.handlers import load_handler, note_signals

log = logging.getLogger("localrt")


class MskPoller(threading.Thread):
    """One partition of an MSK-triggered function's topic, as one of the event source mapping's pollers: a consumer
    assigned that partition alone delivers its records in order, one batch at a time, and commits to the function's
    group only once the batch was handled. Records are keyed by account, so an account's records stay in order while
    the partitions' batches run side by side (the runtime runs each partition's poller in a process of its own).
    Poller `partition` of `pollers` also takes the partitions a topic gains later (a broker that lost its log may have
    it made again with more): those whose number is `partition` modulo `pollers`, so no partition goes unread."""

    # how often a poller follows the topic's partitions, and an idle one asks whether the broker still holds its
    # position (see _check_position)
    POSITION_CHECK_S = 1.0
    # how long a poller waits for an offset missing between records it fetched (see _up_to_hole)
    HOLE_WAIT_S = 2.0

    def __init__(
        self,
        fn: template.Function,
        bootstrap: str,
        stop: threading.Event,
        partition: int,
        handler=None,
        pollers: int = 1,
    ):
        super().__init__(name=f"msk-{fn.name}-{partition}", daemon=True)
        self.fn, self.bootstrap, self.stop_event, self.partition, self.pollers = fn, bootstrap, stop, partition, pollers
        self.handler = handler or load_handler(fn)  # imported in the main thread: see Scheduler
        self.commit_delay_s = float(os.environ.get("HOTLEDGER_LOCAL_COMMIT_DELAY_S", "0"))
        # the first retry's wait, doubled each retry up to a minute (Lambda does not document its own)
        self.retry_backoff_s = float(os.environ.get("HOTLEDGER_LOCAL_RETRY_BACKOFF_S", "1"))
        self.position_checked_at = 0.0
        self.topic_id = None  # the topic's id as the broker last named it (see _log_replaced)
        self.holes: dict = {}  # partition -> (the offset missing, since when), while it is waited for

    def run(self):
        while not self.stop_event.is_set():
            consumer = None
            try:
                consumer = self._consumer()
                while not self.stop_event.is_set():
                    self._poll_once(consumer, self.handler)
            except Exception:  # broker gone: like the event source mapping, reconnect and go on
                log.exception("consumer for %s partition %d failed; reconnecting", self.fn.name, self.partition)
                time.sleep(2)
            finally:
                if consumer is not None:
                    consumer.close(autocommit=False)

    def _consumer(self):
        from kafka import KafkaConsumer

        cfg = self.fn.msk
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap.split(","),
            group_id=cfg["group_id"],
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=cfg["batch_size"],
            max_poll_interval_ms=900000,
            fetch_max_wait_ms=100,
            security_protocol=os.environ.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
        )
        self._follow_partitions(consumer)  # each starts at the group's committed offset
        return consumer

    def _follow_partitions(self, consumer) -> None:
        """Assign the topic's partitions this poller owns (see the class): a partition it already reads keeps its
        position, a new one starts at the group's committed offset."""
        from kafka import TopicPartition

        topic = self.fn.msk["topic"]
        numbers = consumer.partitions_for_topic(topic) or {self.partition}
        owned = {TopicPartition(topic, p) for p in numbers if p % self.pollers == self.partition % self.pollers}
        current = consumer.assignment()
        if owned == current:
            return
        positions = {tp: consumer.position(tp) for tp in owned & current}
        consumer.assign(sorted(owned))
        for tp, offset in positions.items():
            consumer.seek(tp, offset)
        log.info("%s poller %d: partitions %s", self.fn.name, self.partition, sorted(tp.partition for tp in owned))

    def _log_replaced(self, consumer) -> bool:
        """True, and the partitions read again from their beginning, when the topic's id changed: a broker that lost its
        log (Tansu's memory storage, killed) has the topic made again, and may take more records than this consumer's
        position before the consumer asks again; the position is then inside the new log, and the records below it
        are new ones it would skip (acknowledged ones among them). _check_position covers a position past the end."""
        # kafka-python keeps the ids of the Metadata answers (v10+) on its cluster view; it has no public accessor
        topic_id = consumer._client.cluster.topic_id(self.fn.msk["topic"])
        known, self.topic_id = self.topic_id, topic_id or self.topic_id
        if known is None or topic_id is None or topic_id == known:
            return False
        log.warning(
            "%s poller %d: the topic was made again (the broker lost its log); reading its partitions again "
            "from their beginning",
            self.fn.name,
            self.partition,
        )
        self._follow_partitions(consumer)
        consumer.seek_to_beginning()
        return True

    def _check_position(self, consumer) -> None:
        """Start the partition again from its beginning when the broker no longer holds the consumer's position: a
        broker that lost its log (Tansu's memory storage, killed) numbers from 0 again, and a consumer left past the
        new log's end would skip every record up to its old position, acknowledged ones among them.
        The end the broker reports is not trusted alone: Tansu's ListOffsets(latest) answers the last record batch's
        base offset + 1 (5 records in one batch: 1), so a position beyond it is checked by reading that last batch."""
        for tp in consumer.assignment():
            self._check_partition_position(consumer, tp)

    def _check_partition_position(self, consumer, tp) -> None:
        position = consumer.position(tp)
        reported_end = consumer.end_offsets([tp])[tp]
        if position <= reported_end:
            return
        end, read = reported_end, reported_end == 0
        if not read:
            consumer.seek(tp, reported_end - 1)
            deadline = time.monotonic() + 5
            while end < position and time.monotonic() < deadline:
                records = consumer.poll(timeout_ms=200).get(tp, [])
                if records:
                    end, read = records[-1].offset + 1, True
                elif read:
                    break  # read to the end
            if not read:  # the last batch could not be read: no verdict, ask again later
                consumer.seek(tp, position)
                return
        if end >= position:
            consumer.seek(tp, position)
            return
        log.warning(
            "%s partition %d: the broker's log ends at %d, before this consumer's position %d (the broker "
            "lost its log); reading the partition again from its beginning",
            self.fn.name,
            tp.partition,
            end,
            position,
        )
        consumer.seek_to_beginning(tp)

    def _poll_once(self, consumer, handler) -> None:
        """Deliver one batch under the trigger's error contract (_deliver); commit, per partition, up to the first
        record not settled (all of them unless the runtime is stopping) and rewind there."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        batch = self._collect(consumer, self.fn.msk)
        if self._log_replaced(consumer):
            return  # what this poll fetched comes again, from the beginning
        if time.monotonic() - self.position_checked_at >= self.POSITION_CHECK_S:
            self._follow_partitions(consumer)
            if not batch:
                self._check_position(consumer)
            self.position_checked_at = time.monotonic()
        if not batch:
            return
        settled = self._deliver(handler, batch)
        commit, rewind = {}, {}
        for record in sorted(batch, key=lambda r: (r.partition, r.offset)):
            tp = TopicPartition(record.topic, record.partition)
            if tp in rewind:
                continue
            if (record.partition, record.offset) in settled:
                commit[tp] = OffsetAndMetadata(record.offset + 1, "", -1)
            else:
                rewind[tp] = record.offset
        if commit:
            log.info(
                "batch of %d handled; committing %s",
                len(batch),
                {f"{t.topic}-{t.partition}": o.offset for t, o in commit.items()},
            )
            time.sleep(self.commit_delay_s)
            consumer.commit(commit)
        for tp, offset in rewind.items():
            consumer.seek(tp, offset)

    def _deliver(self, handler, batch: list) -> set:
        """The MSK trigger's error contract as the template configures it (provisioned pollers):
        - records older than MaximumRecordAgeInSeconds go to the on-failure destination without an invocation;
        - an invocation that raises, with BisectBatchOnFunctionError, is split in two halves retried on their own
          (a split is not a retry), until the failing record stands alone;
        - with ReportBatchItemFailures, a partition is retried from its first reported record (the ones before it are
          done); without it the answer is ignored and the batch counts as a success;
        - after MaximumRetryAttempts retries (-1: forever, blocking its partitions) the records that failed the last
          attempt go, one by one and whole, to the on-failure destination (kafka://<topic>); the partitions move on.
        Returns the (partition, offset) settled: handled, or handed to the destination."""
        cfg = self.fn.msk
        settled: set = set()
        if cfg["max_record_age_s"] >= 0:
            oldest_ms = time.time() * 1000 - cfg["max_record_age_s"] * 1000
            expired = [r for r in batch if r.timestamp < oldest_ms]
            settled |= self._give_up(expired, "MaximumRecordAgeInSeconds exceeded")
        fresh = [r for r in batch if (r.partition, r.offset) not in settled]
        work = collections.deque([(fresh, 0)] if fresh else [])
        backoff = self.retry_backoff_s
        while work and not self.stop_event.is_set():
            records, retries = work.popleft()
            failed, raised = self._invoke(handler, cfg["topic"], records)
            if not failed:
                settled |= {(r.partition, r.offset) for r in records}
                continue
            if raised and cfg["bisect"] and len(records) > 1:
                half = len(records) // 2
                work.extendleft([(records[half:], retries), (records[:half], retries)])
                continue
            first_failed: dict = {}
            for r in records:
                if (r.partition, r.offset) in failed:
                    first_failed[r.partition] = min(r.offset, first_failed.get(r.partition, r.offset))
            again = [r for r in records if r.partition in first_failed and r.offset >= first_failed[r.partition]]
            settled |= {(r.partition, r.offset) for r in records} - {(r.partition, r.offset) for r in again}
            if 0 <= cfg["max_retries"] <= retries:  # the failed records go; the others of the last attempt are done
                settled |= {(r.partition, r.offset) for r in again} - failed
                settled |= self._give_up(
                    [r for r in again if (r.partition, r.offset) in failed],
                    f"MaximumRetryAttempts ({cfg['max_retries']}) exhausted",
                )
                continue
            self.stop_event.wait(backoff)
            backoff = min(backoff * 2, 60.0)
            work.appendleft((again, retries + 1))
        return settled

    def _give_up(self, records: list, reason: str) -> set:
        """Hand records to the on-failure destination, whole (key, value, headers) plus where they came from and why."""
        if not records:
            return set()
        topic = self.fn.msk["dead_letter_topic"]
        if topic is None:  # no destination: Lambda drops them; say so loudly (the template always has one)
            log.error("%s: %d records dropped (%s) - no on-failure destination", self.fn.name, len(records), reason)
            return {(r.partition, r.offset) for r in records}
        from kafka import KafkaProducer

        services.ensure_topic(self.bootstrap, topic, 1)
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap.split(","),
            acks="all",
            security_protocol=os.environ.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
        )
        try:
            for r in records:
                meta = [
                    ("source-topic", r.topic.encode()),
                    ("source-partition", str(r.partition).encode()),
                    ("source-offset", str(r.offset).encode()),
                    ("failure-reason", reason.encode()),
                ]
                producer.send(topic, key=r.key, value=r.value, headers=list(r.headers or []) + meta)
            producer.flush(timeout=30)
        finally:
            producer.close(timeout=5)
        log.error("%s: %d records sent to %s (%s)", self.fn.name, len(records), topic, reason)
        return {(r.partition, r.offset) for r in records}

    def _collect(self, consumer, cfg) -> list:
        batch, deadline = [], time.monotonic() + max(cfg["window_s"], 0.05)
        while len(batch) < cfg["batch_size"]:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 and batch:
                break
            expected = {tp: consumer.position(tp) for tp in consumer.assignment()}
            polled = consumer.poll(
                timeout_ms=max(remaining_ms, 200 if not batch else 0), max_records=cfg["batch_size"] - len(batch)
            )
            for tp, records in polled.items():
                batch.extend(self._up_to_hole(consumer, tp, expected.get(tp), records))
            if not polled and time.monotonic() >= deadline:
                break
        return batch

    def _up_to_hole(self, consumer, tp, expected: int | None, records: list) -> list:
        """The records of a poll up to the first offset missing among them, the consumer sent back to that offset.
        Tansu can serve a record before another produced at the same moment just below it (seen under load: offsets
        11277, 11278 and 11280 fetched, 11279 not yet; 11279's timestamp a millisecond before 11280's), and the
        consumer's position then passes the record it never saw: an acknowledged event never delivered (until the
        reconciler's RECONCILE_AGE_S). Kafka and MSK give a plain topic contiguous offsets; a hole that is real there
        (a transaction marker, a compacted record) is passed after HOLE_WAIT_S."""
        taken = []
        for record in records:
            if expected is not None and record.offset > expected:
                if self.holes.get(tp, (None,))[0] != expected:  # a new hole: its wait starts now
                    self.holes[tp] = (expected, time.monotonic())
                if time.monotonic() - self.holes[tp][1] < self.HOLE_WAIT_S:
                    consumer.seek(tp, expected)
                    return taken
                log.warning(
                    "%s partition %d: offsets %d-%d never came; going on from %d",
                    self.fn.name,
                    tp.partition,
                    expected,
                    record.offset - 1,
                    record.offset,
                )
            self.holes.pop(tp, None)
            taken.append(record)
            expected = record.offset + 1
        return taken

    def _invoke(self, handler, topic: str, batch: list) -> tuple[set, bool]:
        """One invocation: the records reported failed (all of them when the function raised), and whether it raised."""
        event = events.msk(
            topic, [(r.partition, r.offset, r.key, r.value, r.timestamp) for r in batch], bootstrap=self.bootstrap
        )
        try:
            response = handler(event, events.LambdaContext(self.fn.name, self.fn.timeout_s))
        except Exception:
            log.exception("function %s failed on %d records", self.fn.name, len(batch))
            return {(r.partition, r.offset) for r in batch}, True
        if not self.fn.msk["partial_batch"]:
            return set(), False
        failures = (response or {}).get("batchItemFailures") or []
        return {
            (int(f["itemIdentifier"]["partition"].rsplit("-", 1)[1]), int(f["itemIdentifier"]["offset"]))
            for f in failures
        }, False


def start_msk_pollers(fn: template.Function, bootstrap: str, partitions: list[int], handler) -> list[int]:
    """A process per partition, each running that partition's MskPoller (Lambda runs the pollers' invocations side by
    side in execution environments of their own; one process also keeps each partition's writer off the others' GIL)."""
    pids = []
    for partition in partitions:
        pid = os.fork()
        if pid == 0:
            try:
                signalled, stop = note_signals(), threading.Event()
                poller = MskPoller(fn, bootstrap, stop, partition, handler, len(partitions))
                poller.start()
                while not signalled:
                    time.sleep(0.2)
                stop.set()
                poller.join(timeout=10)
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def start_msk_trigger(fn: template.Function, bootstrap: str) -> int:
    """A process that waits for the broker, makes the topic, then runs a poller per partition (start_msk_pollers)
    until it is told to stop: the runtime starts and serves without the broker, as a Lambda does, and its writes answer
    503 until the broker is there. Exits when a poller does, so the runtime stops as for any child."""
    handler_module = load_handler(fn)  # imported before the fork, as the other children's handlers
    pid = os.fork()
    if pid != 0:
        return pid
    try:
        signalled = note_signals()
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        while not signalled and not services.reachable(host, int(port)):
            time.sleep(0.5)
        if signalled:
            os._exit(0)
        services.ensure_topic(bootstrap, fn.msk["topic"], services.LOCAL_PARTITIONS)
        partitions = services.topic_partitions(bootstrap, fn.msk["topic"])
        pollers = start_msk_pollers(fn, bootstrap, partitions, handler_module)
        log.info(
            "%s: MSK topic %s, %d partitions (a poller each), batch %d, window %.1fs",
            fn.name,
            fn.msk["topic"],
            len(partitions),
            fn.msk["batch_size"],
            fn.msk["window_s"],
        )
        while not signalled and not any(os.waitpid(p, os.WNOHANG)[0] for p in pollers):
            time.sleep(0.2)
        for poller in pollers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(poller, signal.SIGTERM)
        for poller in pollers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(poller, 0)
    finally:
        os._exit(0)
