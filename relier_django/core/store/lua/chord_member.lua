-- chord_member.lua: a chord header member's result, handed over to the chord's
-- partition (a partitioned store: store/handover.py), counted there once; the member
-- that completes the header records the callback's own hand-over in the same step.
-- Serves G13 (a chord callback runs exactly once, with every member's result) and G10:
-- a member's result is written under its index, so a replay, the sweep racing the
-- worker, or a redelivery counts it once; 'fired' names the completing member, so a
-- second completion of the header is impossible and its replay answers the same.
-- The same counting as commit.lua's for a chord member on an unpartitioned store.
--
-- KEYS[1]  the chord's state (keys.chord): 'size' (the producer's), 'r:<index>' per
--          member, 'fired' (the completing member's id)
-- KEYS[2]  the chord's partition's hand-over index   KEYS[3] its hand-over records
-- ARGV[1]  the member's id   ARGV[2] its index in the header   ARGV[3] its result, JSON
-- ARGV[4]  how long the chord's state is kept after this write, ms (chords.KEEP_MS)
-- ARGV[5]  the callback's hand-over record (store/handover.py's record: the callback)
-- ARGV[6]  that hand-over's token (handover.callback_token: one per chord)
-- RETURNS  1  this member completed the header: the callback's hand-over is recorded
--             (a replay answers the same)
--          0  the header is not complete yet, or another member completed it
-- @include _clock
local chord = KEYS[1]
local fired = redis.call('HGET', chord, 'fired')
if fired then
  return fired == ARGV[1] and 1 or 0
end
redis.call('HSET', chord, 'r:' .. ARGV[2], ARGV[3])
-- On a partitioned store the state keeps a TTL (never sealed: docs/workflows.md),
-- refreshed by each member's result.
redis.call('PEXPIRE', chord, ARGV[4])
local size = tonumber(redis.call('HGET', chord, 'size') or '')
if not size or redis.call('HLEN', chord) - 1 < size then
  return 0
end
redis.call('HSET', chord, 'fired', ARGV[1])
local _, now_text = clock()
redis.call('ZADD', KEYS[2], now_text, ARGV[6])
redis.call('HSET', KEYS[3], ARGV[6], ARGV[5])
return 1
