-- resurrect.lua: for a batch of expired tasks, take the lease on each and mint its next
-- fence, or, past its resurrection limit, lease it for the DLQ. One call per batch:
-- a pass costs a round trip per batch, not per task.
-- Serves G1/G3 (a task whose heartbeat expired is brought back) and G2 (the dead or
-- paused incarnation's fence is dead from here on). Each deadline is checked against
-- the Redis clock, so a scanner with a skewed clock can never act early.
--
-- KEYS[1]        expiry index
-- KEYS[2i]       task hash of the i-th task    KEYS[2i+1]  its history list
-- ARGV[1]        lease, ms: how long this scanner has to dispatch before another may retry
-- ARGV[2]        scanner id (for the history)
-- ARGV[2+i]      task id of the i-th task
-- RETURNS        one reply per task, in order:
--   {1, new_fence, envelope, resurrections, name, queue, idem}   leased: dispatch the
--      envelope with new_fence
--   {2, fence, envelope, resurrections, name, queue, idem}       over the limit:
--      dead-letter it with fence
--   name, queue and idem (the idempotency key, '' if none) are the task hash's own,
--   so a task whose stored envelope cannot be read can still be dead-lettered whole
--   (its claim released, its entry indexed under its task)
--   {0, 'alive'}   deadline not reached (refreshed, started, or leased by another pass)
--   {0, 'gone'}    no such task: the index entry was stale and has been removed
--   {-1, error}    this task's step failed (a hash edited by hand, say); the others in
--                  the batch are answered all the same
-- A hash that lost its counters counts as past its limit: it goes to the DLQ whole.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now_ms + tonumber(ARGV[1])

local function resurrect(id, hash, history)
  local deadline = redis.call('ZSCORE', KEYS[1], id)
  if not deadline or tonumber(deadline) > now_ms then
    return {0, 'alive'}
  end
  local f = redis.call('HMGET', hash, 'fence', 'env', 'res', 'maxres', 'state', 'worker',
    'name', 'queue', 'idem')
  if not f[1] then
    redis.call('ZREM', KEYS[1], id)
    return {0, 'gone'}
  end
  if f[5] ~= 'dying' then
    -- One entry per incarnation that died; a re-leased 'dying' task already has its own.
    redis.call('RPUSH', history, '{"at_ms":' .. now_ms .. ',"event":"expired","fence":' ..
      f[1] .. ',"state":' .. cjson.encode(f[5]) .. ',"worker":' .. cjson.encode(f[6] or '') ..
      ',"scanner":' .. cjson.encode(ARGV[2]) .. '}')
  end
  local res, maxres = tonumber(f[3]) or 0, tonumber(f[4]) or 0
  if f[5] == 'dying' or res >= maxres then
    redis.call('HSET', hash, 'state', 'dying')
    redis.call('ZADD', KEYS[1], lease_until, id)
    return {2, tonumber(f[1]), f[2], res, f[7] or '', f[8] or '', f[9] or ''}
  end
  local fence = redis.call('HINCRBY', hash, 'fence', 1)
  redis.call('HSET', hash, 'state', 'queued', 'worker', '')
  redis.call('ZADD', KEYS[1], lease_until, id)
  return {1, fence, f[2], res, f[7] or '', f[8] or '', f[9] or ''}
end

local replies = {}
for i = 3, #ARGV do
  local k = 2 * (i - 2)
  local ok, reply = pcall(resurrect, ARGV[i], KEYS[k], KEYS[k + 1])
  if not ok then  -- a Redis error reply is a table {err = ...}, a Lua error a string
    reply = {-1, type(reply) == 'table' and tostring(reply.err) or tostring(reply)}
  end
  replies[#replies + 1] = reply
end
return replies
