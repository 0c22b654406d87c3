-- handover_store.lua: store one task a hand-over names, in its own partition, once.
-- Serves G1 and G13 across partitions: on a partitioned store a step's commit cannot
-- reach its successor's partition (a Redis Cluster runs a script on one slot), so
-- commit.lua records a hand-over in the step's partition (store/handover.py), and this
-- script, run right after by the worker or later by the scanner leader's sweep, stores
-- the successor. G10: once only, whoever runs it and however often: a successor this
-- hand-over already stored (its marker, KEYS[4]) or an id that has a task or a result
-- is left alone, so a replay, the sweep racing the worker, or a completion after the
-- successor committed stores nothing twice.
--
-- The task is stored as _links.lua stores a callback: fence 1, 'scheduled' in its
-- partition's schedule index due now (the scanner leader dispatches it, fenced, as any
-- scheduled task: G11). No flow control: a partitioned store has none.
--
-- KEYS[1]  the successor's partition's expiry index (its prefix names the schedule
--          index and its wake-up list, as _limits.lua's limit_schedule builds them)
-- KEYS[2]  the successor's task hash   KEYS[3] its result key
-- KEYS[4]  its hand-over marker (keys.handed): the token that stored it
-- KEYS[5]  the partition's metrics counters ('' when metrics are off)
-- ARGV[1]  the successor's id   ARGV[2] its envelope (fence 1)   ARGV[3] its task name
-- ARGV[4]  its queue   ARGV[5] its max resurrections
-- ARGV[6]  the hand-over's token (the id of the task whose commit recorded it)
-- ARGV[7]  how long the marker is kept, ms (at least the successor's result's TTL)
-- ARGV[8]  the audit ledger's horizon, ms ('' or 0: off): a successor stored is noted
--          in its partition's ledger (_ledger.lua), as commit.lua notes a chain's step
-- RETURNS  1  the successor was stored by this hand-over (now, or by an earlier call
--             with this token: a replay answers the same)
--          0  its id was taken by something else; nothing stored
-- @include _metrics
-- @include _clock
-- @include _limits
-- @include _links
-- @include _ledger
local mark = redis.call('GET', KEYS[4])
if mark then
  return mark == ARGV[6] and 1 or 0
end
local now_ms, now_text = clock()
local created = link_create(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4],
  ARGV[5], '', now_ms, now_text, KEYS[5])
if created == 1 then
  redis.call('SET', KEYS[4], ARGV[6], 'PX', ARGV[7])
  ledger_note(KEYS[1], ARGV[8], now_ms, ARGV[1])
end
return created
