-- resurrect.lua: take the lease on one expired task and mint its next fence, or, past
-- its resurrection limit, lease it for the DLQ. One call per task per pass.
-- Serves G1/G3 (a task whose heartbeat expired is brought back) and G2 (the dead or
-- paused incarnation's fence is dead from here on). The deadline is checked against
-- the Redis clock, so a scanner with a skewed clock can never act early.
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- ARGV[1]  task id
-- ARGV[2]  lease, ms: how long this scanner has to dispatch before another may retry
-- ARGV[3]  scanner id (for the history)
-- RETURNS  {1, new_fence, envelope, resurrections, name, queue, idem}   leased: dispatch
--             the envelope with new_fence
--          {2, fence, envelope, resurrections, name, queue, idem}       over the limit:
--             dead-letter it with fence
--          name, queue and idem (the idempotency key, '' if none) are the task hash's own,
--          so a task whose stored envelope cannot be read can still be dead-lettered
--          whole (its claim released, its entry indexed under its task)
--          {0, 'alive'}   deadline not reached (refreshed, started, or leased by another pass)
--          {0, 'gone'}    no such task: the index entry was stale and has been removed
local id = ARGV[1]
local deadline = redis.call('ZSCORE', KEYS[3], id)
if not deadline then
  return {0, 'alive'}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(deadline) > now_ms then
  return {0, 'alive'}
end
local f = redis.call('HMGET', KEYS[1], 'fence', 'env', 'res', 'maxres', 'state', 'worker',
  'name', 'queue', 'idem')
if not f[1] then
  redis.call('ZREM', KEYS[3], id)
  return {0, 'gone'}
end
local lease_until = now_ms + tonumber(ARGV[2])
if f[5] ~= 'dying' then
  -- One entry per incarnation that died; a re-leased 'dying' task already has its own.
  redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_ms .. ',"event":"expired","fence":' .. f[1] ..
    ',"state":' .. cjson.encode(f[5]) .. ',"worker":' .. cjson.encode(f[6] or '') ..
    ',"scanner":' .. cjson.encode(ARGV[3]) .. '}')
end
local res, maxres = tonumber(f[3]), tonumber(f[4])
if f[5] == 'dying' or res >= maxres then
  redis.call('HSET', KEYS[1], 'state', 'dying')
  redis.call('ZADD', KEYS[3], lease_until, id)
  return {2, tonumber(f[1]), f[2], res, f[7] or '', f[8] or '', f[9] or ''}
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'state', 'queued', 'worker', '')
redis.call('ZADD', KEYS[3], lease_until, id)
return {1, fence, f[2], res, f[7] or '', f[8] or '', f[9] or ''}
