-- presence.lua: a worker's main process says it is alive until now + TTL (Redis clock),
-- or that it leaves; entries whose deadline passed are dropped in the same step.
-- Serves the live view only (relier_workers_alive, manage.py relier_status): no
-- guarantee rests on it, since every task a worker holds has its own heartbeat.
--
-- KEYS[1]  workers (zset): worker id -> liveness deadline, ms
-- ARGV[1]  worker id (hostname:pid)
-- ARGV[2]  TTL, ms, or 0: the worker leaves (a warm shutdown)
-- RETURNS  how many workers are alive after this call
-- A replay after a lost reply writes the same member with a deadline as late or later,
-- or removes a member already removed: it changes nothing a reader could tell apart.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now_ms)
if tonumber(ARGV[2]) > 0 then
  redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[2]), ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
