-- retry.lua: turn a failed incarnation into the next one (same task id, fence + 1).
-- Serves G1 (the new incarnation is covered by the expiry index before it is sent) and
-- G2 (the failed incarnation's fence is dead from here on).
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- KEYS[4]  schedule index   KEYS[5]  the scheduler's wake-up list
-- KEYS[6]  metrics counters   KEYS[7]  metrics windows ('' each when metrics are off)
-- ARGV[1]  task id
-- ARGV[2]  fence of the failed incarnation (must be current)
-- ARGV[3]  the next envelope, canonical JSON, carrying fence ARGV[2] + 1
-- ARGV[4]  countdown before the next incarnation may start, ms
-- ARGV[5]  queued grace, ms (as in push.lua)
-- ARGV[6]  history event: JSON object without its opening brace (see start.lua)
-- ARGV[7]  request token: unique per call, the same in a replay of it
-- With a countdown, the next incarnation waits in the schedule index ('scheduled'), not
-- in a worker's memory as a countdown message: the scanner leader dispatches it (G11);
-- so does a task with a rate (field 'rt'), at once, for its dispatch to be reserved.
-- RETURNS  {1, new_fence, state}  the next incarnation is stored: 'queued', send it now;
--                                 'scheduled', send nothing (a replay
--                                 of this call after a lost reply, found by its token,
--                                 answers the same, so the retry is still sent)
--          {0, current_fence}     rejected: the fence moved (-1: the task is gone)
-- Counts: 'retried' once per retry (a replay answers before counting). 'q_ms' (when the
-- next incarnation may start) is what start.lua measures its queue wait from.
-- @include _metrics
local id = ARGV[1]
local fields = redis.call('HMGET', KEYS[1], 'fence', 'state', 'retry_req', 'rt')
if fields[1] ~= ARGV[2] or fields[2] ~= 'running' then
  if fields[3] == ARGV[7] and tonumber(fields[1]) == tonumber(ARGV[2]) + 1 then
    local was = redis.call('HGET', KEYS[1], 'retry_state')
    return {1, tonumber(fields[1]), was or 'queued'}
  end
  return {0, tonumber(fields[1]) or -1}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local delay = tonumber(ARGV[4])
-- A task with a rate goes through the leader's dispatch again, which reserves the new
-- attempt's own dispatch time (its slot, if it holds one, it keeps: _limits.lua).
local rated = fields[4] and fields[4] ~= ''
local state = (delay > 0 or rated) and 'scheduled' or 'queued'
if rated then
  redis.call('HSET', KEYS[1], 'rt_h', '0')
end
redis.call('HSET', KEYS[1], 'env', ARGV[3], 'state', state, 'worker', '',
  'retry_req', ARGV[7], 'retry_state', state, 'q_ms', now_ms + delay)
metric_count(KEYS[6], 'retried')
redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_ms .. ',' .. ARGV[6])
if state == 'scheduled' then
  local due = now_ms + delay
  redis.call('HSET', KEYS[1], 'due_ms', due)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[4], due, id)
  if redis.call('ZRANGE', KEYS[4], 0, 0)[1] == id then
    redis.call('DEL', KEYS[5])
    redis.call('LPUSH', KEYS[5], due)
  end
else
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[5]), id)
end
return {1, fence, state}
