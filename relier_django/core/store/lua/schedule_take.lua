-- schedule_take.lua: take the due tasks of the schedule index for dispatch, and lease
-- each: one call per batch, on the scanner leader.
-- Serves G11 (a scheduled task is dispatched once, never before its time on the Redis
-- clock) and G1 (from here on the expiry index covers it: a leader that dies before its
-- publish leaves a lease that runs out, and the resurrector re-dispatches it, fenced).
--
-- KEYS[1]      schedule index (zset)     KEYS[2]  expiry index (zset)
-- KEYS[2+i]    task hash of the i-th task
-- KEYS[#ARGV+1]  metrics counters <p>:m ('' when metrics are off): a gated task that
--              has to wait for its rate's time or for a slot is counted (_limits.lua)
-- ARGV[1]      lease, ms: how long the caller has to publish before the resurrector may
-- ARGV[2]      request token: unique per call, the same in a replay of it
-- ARGV[2+i]    task id of the i-th task
-- RETURNS      one reply per task, in order:
--   {1, fence, envelope, expired, name, queue, idem, waited}  leased ('queued', its
--        fence unchanged: no message was ever sent for it): publish the envelope, or,
--        with expired = 1 (its expiry passed before it was due), dead-letter it
--        (expired). waited: ms from its parking to now when it had waited parked and
--        was handed a slot (the caller tells it, task_unparked), else ''; kept in the
--        hash ('park_wait') for a replay, 'parked_ms' dropped so a later incarnation
--        is not told again
--   {0, 'not_due'}  its due time has not come on the Redis clock
--   {0, 'gone'}     not scheduled any more (cancelled, or taken by another pass); its
--                   index entry, if any, is removed
--   {0, 'parked', name, scope, key}  gated (G14, _limits.lua): no slot of its scope
--                   is free; it waits in its key's line, handed a slot by the script
--                   that frees one (the caller tells it, task_parked). A replay finds
--                   it parked and answers the same
-- A gated task (fields 'lim' or 'rt') due and not expired goes through its gate first:
-- its rate may make it due later ({0, 'not_due'}, at its reserved time), its scope may
-- park it; otherwise it is leased with its slot held.
-- A debounced task (field 'db', push.lua) leased here deletes its debounce record if
-- the record still names it (a key read from the hash: unpartitioned stores only).
-- A replay of this call after a lost reply finds each task it took by the token (field
-- 'lease') and answers as the first call did.
-- @include _metrics
-- @include _limits
local mkey = KEYS[#ARGV + 1] or ''
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now_ms + tonumber(ARGV[1])
local prefix = limit_prefix(KEYS[2])
local replies = {}
for i = 3, #ARGV do
  local id, hash = ARGV[i], KEYS[i]
  local f = redis.call('HMGET', hash, 'fence', 'env', 'state', 'name', 'queue', 'idem',
    'expires_ms', 'lease', 'lim', 'rt', 'db', 'lim_k', 'park_wait', 'parked_ms')
  local expired = (f[7] and tonumber(f[7]) < now_ms) and 1 or 0
  local reply
  if f[8] == ARGV[2] and f[3] == 'queued' then
    reply = {1, tonumber(f[1]), f[2], expired, f[4] or '', f[5] or '', f[6] or '', f[13] or ''}
  elseif f[3] == 'parked' then
    -- Parked by this call before (a replay) or another pass: a freed slot dispatches it.
    redis.call('ZREM', KEYS[1], id)
    reply = {0, 'parked', f[4] or '', f[9] or '', f[12] or ''}
  elseif not f[1] or f[3] ~= 'scheduled' then
    redis.call('ZREM', KEYS[1], id)
    reply = {0, 'gone'}
  else
    local due = redis.call('ZSCORE', KEYS[1], id)
    local verdict = 'go'
    if due and tonumber(due) <= now_ms and expired == 0 and ((f[9] or '') ~= '' or (f[10] or '') ~= '') then
      verdict = limit_gate(prefix, hash, id, now_ms, mkey)
    end
    if not due or tonumber(due) > now_ms or verdict == 'later' then
      reply = {0, due and 'not_due' or 'gone'}
    elseif verdict == 'parked' then
      reply = {0, 'parked', f[4] or '', f[9] or '', f[12] or ''}
    else
      local waited = ''
      if f[14] then
        waited = string.format('%d', math.max(0, now_ms - tonumber(f[14])))
        redis.call('HDEL', hash, 'parked_ms')
      end
      redis.call('HSET', hash, 'state', 'queued', 'lease', ARGV[2], 'park_wait', waited)
      if f[11] and redis.call('GET', f[11]) == id then
        redis.call('DEL', f[11])  -- its debounce window is over: a later push starts one
      end
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZADD', KEYS[2], lease_until, id)
      reply = {1, tonumber(f[1]), f[2], expired, f[4] or '', f[5] or '', f[6] or '', waited}
    end
  end
  replies[#replies + 1] = reply
end
return replies
