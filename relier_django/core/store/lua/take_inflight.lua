-- take_inflight.lua: take the next message from a worker's queues on a Redis broker
-- that is not the store, keeping a copy of a relier message under the taker's in-flight
-- record until the taker has registered it; and drop the copies of the messages it
-- registered since its previous take, in the same step.
-- Serves G15 (a pop that leaves a trace) where take.lua cannot run (the broker is not
-- the store's server and database, or the store is partitioned): a relier message
-- leaves its queue only with a copy in the taker's record, so a taker found dead by its
-- closed connection has its copies put back in its queues by the scanner that hands
-- off its tasks (restore_inflight.lua), instead of waiting QUEUED_GRACE_S. A message
-- that is not relier's is not recorded: it keeps kombu's handling.
--
-- KEYS[1..n]     the queue lists, in the order to ask them (n = ARGV[1])
-- KEYS[n+1..2n]  each queue list's doorbell (transport.bell_of), in the same order
-- KEYS[2n+1]     the taker's in-flight record (hash, transport.inflight_of): field
--                '#' counts the copies ever kept; field <k> holds the k-th copy as
--                '<length of its list key>:<list key><message>'
-- ARGV[1]  n
-- ARGV[2]  the header that marks a relier message (found by its quoted name)
-- ARGV[3..]  the fields of copies to drop: messages the taker has received and
--          registered since (its reservation heartbeat covers them now)
-- RETURNS  false: every queue is empty
--          {list, message, k}: the message taken from list; k: the field of its copy,
--          0 when none was kept (a message that is not relier's)
-- Not answered the same twice: a second call takes the next message. Its reply lost,
-- the copy stays in the taker's record (it is not among the fields a later call drops)
-- and comes back when the taker dies or shuts down; a copy put back of a task that runs
-- is refused at its start (fence).
-- @include _take
local n = tonumber(ARGV[1])
local record = KEYS[2 * n + 1]
if #ARGV > 2 then
  redis.call('HDEL', record, unpack(ARGV, 3))
end
local i, message = take_next(n)
if not i then
  return false
end
local k = 0
if string.find(message, '"' .. ARGV[2] .. '"', 1, true) then
  k = redis.call('HINCRBY', record, '#', 1)
  redis.call('HSET', record, k, string.len(KEYS[i]) .. ':' .. KEYS[i] .. message)
end
return {KEYS[i], message, k}
