-- schedule_sent.lua: the broker accepted the dispatched scheduled tasks: each lease
-- from schedule_take.lua becomes a queued grace, as push.lua gives a task it queues.
-- Serves G1: a task the leader published is covered by the expiry index like any
-- queued task. Idempotent: a replay after a lost reply writes the same deadlines.
--
-- KEYS[1]      expiry index
-- KEYS[1+i]    task hash of the i-th task
-- ARGV[1]      queued grace, ms     ARGV[2]  the token schedule_take.lua was called with
-- ARGV[1+2i]   task id of the i-th task     ARGV[2+2i]  its fence, as taken
-- RETURNS      how many were still as taken (the others had started, or moved on)
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local kept = 0
for i = 2, #KEYS do
  local id, fence = ARGV[2 * i - 1], ARGV[2 * i]
  local f = redis.call('HMGET', KEYS[i], 'fence', 'state', 'lease')
  if f[1] == fence and f[2] == 'queued' and f[3] == ARGV[2] then
    redis.call('ZADD', KEYS[1], until_ms, id)
    kept = kept + 1
  end
end
return kept
