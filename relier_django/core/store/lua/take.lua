-- take.lua: take the next message from a worker's queues and, when it carries a task
-- that waits for it, mark that task held by the taking worker, in one step.
-- Serves G15 (a pop that leaves a trace) and G1: a message leaves its queue only with
-- its task marked held by the taker (field 'worker') and due within one heartbeat TTL
-- in the expiry index. A taker that dies before it registers the message in its own
-- books (SIGKILL with this call's reply in flight) is found dead by its connection,
-- and the scanner hands off every task marked with its name (orphans.lua) in the same
-- pass as its running ones; a taker that lives but never receives the message (this
-- reply lost) stops refreshing it, and it is resurrected after one TTL. Before, the
-- worker waited in BRPOP on its queues, and a message popped into the socket of a
-- worker being SIGKILLed waited QUEUED_GRACE_S.
-- Non-blocking: when every queue is empty the worker waits on the queues' doorbells
-- (BZPOPMIN: each is a sorted set of one member, rung by whoever queues a message; the
-- wait pops only a doorbell, so losing one loses no message) and asks again.
--
-- KEYS[1..n]     the queue lists, in the order to ask them (the recovery queue's first,
--                then level by level, highest priority first: redis_channel.ask_order);
--                n = ARGV[1]
-- KEYS[n+1..2n]  each queue list's doorbell (transport.bell_of), in the same order
-- KEYS[2n+1]     expiry index
-- ARGV[1]  n
-- ARGV[2]  the taking worker's id (hostname:pid), as its liveness connection names it
-- ARGV[3]  heartbeat TTL, ms: the taken task is due within it unless the taker's
--          reservation heartbeat (heartbeat.lua, 'queued') refreshes it
-- ARGV[4], ARGV[5]  the task hash key's parts around the task id (keys.py builds
--          them: the id is only known once the message is read; an unpartitioned
--          store only, where every key is on the one server)
-- ARGV[6]  the header that marks a relier message and carries its fence
-- RETURNS  false: every queue is empty
--          {list, message, held}: the message taken from list; held = 1 when its task
--          was marked held by this taker (fence current, state 'queued'), else 0 (a
--          message that is not relier's, a stale copy, a task already running)
-- Not answered the same twice: a second call takes the next message. Its reply lost,
-- the message is the taker's and its task comes back within one TTL, as above.
-- @include _take
-- @include _clock
-- The message's id and fence, read from kombu's JSON as it writes it (', ' and ': '
-- between items), without decoding the whole message: a full cjson.decode builds every
-- header and the body as Lua values, about a third of this script's work. Anything
-- else (another writer's spacing, an id with an escape) is decoded in full.
local function id_and_fence(message, header)
  -- Plain finds (memchr, not a pattern tried at every position), then anchored reads.
  local key = '"' .. header .. '": '
  local at = string.find(message, key, 1, true)
  local fence = at and string.match(message, '^(%d+)[,}]', at + #key)
  local id_at = fence and string.find(message, '"id": "', 1, true)
  local id = id_at and string.match(message, '^([^"\\]*)"', id_at + 7)
  if id then
    return id, fence
  end
  local ok, decoded = pcall(cjson.decode, message)
  local headers = ok and type(decoded) == 'table' and decoded.headers
  if type(headers) == 'table' and headers[header] ~= nil and type(headers.id) == 'string' then
    return headers.id, tostring(headers[header])
  end
  return nil, nil
end

local n = tonumber(ARGV[1])
local i, message = take_next(n)
if not i then
  return false
end
local held = 0
local id, fence = id_and_fence(message, ARGV[6])
if id then
  local task = ARGV[4] .. id .. ARGV[5]
  local f = redis.call('HMGET', task, 'fence', 'state')
  if f[1] == fence and f[2] == 'queued' then
    local now_ms = clock()
    redis.call('HSET', task, 'worker', ARGV[2])
    redis.call('ZADD', KEYS[2 * n + 1], ms(now_ms + tonumber(ARGV[3])), id)
    held = 1
  end
end
return {KEYS[i], message, held}
