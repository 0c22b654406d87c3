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
-- ARGV[3]        request token: unique per call, the same in a replay of it
-- ARGV[4]        heartbeat TTL, ms   ARGV[5]  queued grace, ms: with a task's deadline,
--                they date its last sign of life (its last heartbeat; for a message no
--                worker ever held, its send), where a recovery's latency starts
-- ARGV[5+i]      task id of the i-th task
-- RETURNS        one reply per task, in order:
--   {1, new_fence, envelope, resurrections, name, queue, idem, death}   leased:
--      dispatch the envelope with new_fence
--   {2, fence, envelope, resurrections, name, queue, idem, death}       over the
--      limit: dead-letter it with fence
--   death says how the holder died, as far as is known (field 'res_death', and
--   'cause' in the 'expired' history entry): what a pool process's main process saw
--   ('signal:SIGKILL', 'exit:3', 'oom'; handoff.lua's 'death'), else 'pool_death',
--   'connection_closed' (orphans.lua found its liveness connection gone),
--   'ttl_expired' (its heartbeat stopped: host or network lost), 'drain', 'unsent'
--   name, queue and idem (the idempotency key, '' if none) are the task hash's own,
--   so a task whose stored envelope cannot be read can still be dead-lettered whole
--   (its claim released, its entry indexed under its task)
--   {0, 'alive'}   deadline not reached (refreshed, started, or leased by another pass)
--   A replay of this call after a lost reply finds each task it leased by the token
--   (field 'lease') and answers as the first call did, without a second fence or
--   history event, so the scanner still dispatches what it leased.
--   {0, 'gone'}    no such task: the index entry was stale and has been removed
--   {-1, error}    this task's step failed (a hash edited by hand, say); nothing of it
--                  was leased, and the others in the batch are answered all the same
-- A hash that lost its counters counts as past its limit: it goes to the DLQ whole.
-- The limit is the task's 'maxres' for this death's cause (limit_of): an OOM-killed
-- task whose policy says {"oom": 0} goes to the DLQ at once (code 2, death 'oom').
--
-- Cost: the work per task is most of a pass, and each redis.call has a fixed cost
-- beyond its command's, so a task costs three calls (HMGET, a history RPUSH, one HSET
-- that writes the new fence with the state; an HDEL of a pool process's 'death' when
-- its hand-off brought one); the deadlines are read in one ZMSCORE
-- and the leases written in one ZADD per batch.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now_ms + tonumber(ARGV[1])
local first = 6  -- ARGV index of the first task id
local ttl_ms, grace_ms = tonumber(ARGV[4]), tonumber(ARGV[5])

-- Why a leased task needs recovering (the 'res:<cause>' counter resurrected.lua keeps),
-- and its last sign of life: a hand-off (drain, pool_death) dates it by its deadline,
-- the hand-off itself; a running or reserved task (its worker set) by its last
-- heartbeat; a message no worker ever held by its send.
local function cause_of(state, worker, handed_cause, deadline)
  if state == 'handoff' then
    return handed_cause or 'drain', deadline
  elseif state == 'running' or (worker and worker ~= '') then
    return 'heartbeat', deadline - ttl_ms
  end
  return 'unsent', deadline - grace_ms
end

-- How the holder died (see RETURNS), from the state it left the task in.
local function death_of(state, worker, handed_cause, detail)
  if state == 'handoff' then
    if detail and detail ~= '' and handed_cause ~= 'drain' then
      return detail  -- the main process saw its pool process's exit status
    elseif handed_cause == 'process_death' then
      return 'connection_closed'
    end
    return handed_cause or 'drain'
  elseif state == 'running' or (worker and worker ~= '') then
    return 'ttl_expired'
  end
  return 'unsent'
end

-- The resurrection limit for a death of cause 'death': 'maxres' is an integer, or a
-- policy by cause, '<default>,<cause>=<n>,...' (model/resurrections.py): the death's
-- own limit, else its family's ('signal' for 'signal:SIGKILL'), else the default.
local function limit_of(policy, death)
  if not policy then
    return 0
  end
  local default = tonumber(policy:match('^[^,]*')) or 0
  local family = death:match('^([^:]+):')
  local own, kin
  for name, n in policy:gmatch(',([^=,]+)=(%d+)') do
    if name == death then
      own = tonumber(n)
    elseif name == family then
      kin = tonumber(n)
    end
  end
  return own or kin or default
end

-- The history entry around its per-task fields, built once per call.
local expired_head = '{"at_ms":' .. now_ms .. ',"event":"expired","fence":'
local expired_tail = ',"scanner":' .. cjson.encode(ARGV[2]) .. '}'
local json = {}  -- state and worker ids repeat across a batch: encode each once
local function encoded(s)
  local e = json[s]
  if not e then
    e = cjson.encode(s)
    json[s] = e
  end
  return e
end

-- Every deadline in one ZMSCORE per slice of ids (unpack's results live on Lua's C
-- stack, which has a bound). A server older than 6.2 has no ZMSCORE: it is asked one
-- ZSCORE per task instead.
local SLICE = 1000
local deadlines = {}
for at = first, #ARGV, SLICE do
  local last = math.min(at + SLICE - 1, #ARGV)
  local ok, scores = pcall(redis.call, 'ZMSCORE', KEYS[1], unpack(ARGV, at, last))
  for i = at, last do
    if ok then
      deadlines[i] = scores[i - at + 1]
    else
      deadlines[i] = redis.call('ZSCORE', KEYS[1], ARGV[i])
    end
  end
end

local leases = {}  -- score, id pairs: the whole batch's leases, written in one ZADD
local moved = {}   -- id -> its deadline as this call left it (an id given twice)

-- A fence as HINCRBY would accept it, and small enough for Lua's numbers to be exact.
local function fence_of(raw)
  if raw == '0' or (#raw <= 15 and raw:find('^%-?[1-9]%d*$')) then
    return tonumber(raw)
  end
  error('fence is not an integer: ' .. raw)
end

-- The reply the call that leased this task gave, when this call is a replay of it.
local function replayed(hash)
  local f = redis.call('HMGET', hash, 'lease', 'fence', 'env', 'res', 'state', 'name',
    'queue', 'idem', 'res_death')
  if f[1] ~= ARGV[3] then
    return nil
  end
  local code = f[5] == 'dying' and 2 or 1
  return {code, fence_of(f[2]), f[3], tonumber(f[4]) or 0, f[6] or '', f[7] or '', f[8] or '',
    f[9] or ''}
end

local function resurrect(id, deadline, hash, history)
  local again = moved[id] ~= nil  -- an id given twice in this call
  if again then
    deadline = moved[id] or nil
  end
  if not deadline then
    return {0, 'alive'}
  end
  if tonumber(deadline) > now_ms then
    return (not again and replayed(hash)) or {0, 'alive'}
  end
  local f = redis.call('HMGET', hash, 'fence', 'env', 'res', 'maxres', 'state', 'worker',
    'name', 'queue', 'idem', 'rc_found', 'ho_cause', 'death', 'res_death')
  if not f[1] then
    redis.call('ZREM', KEYS[1], id)
    moved[id] = false
    return {0, 'gone'}
  end
  local fence = fence_of(f[1])  -- checked before anything is written
  local death = f[13] or ''
  if f[5] ~= 'dying' then
    -- One entry per incarnation that died; a re-leased 'dying' task already has its own.
    death = death_of(f[5], f[6], f[11], f[12])
    if f[12] then  -- this death's: the next incarnation's is its own
      redis.call('HDEL', hash, 'death')
    end
    redis.call('RPUSH', history, expired_head .. f[1] .. ',"state":' .. encoded(f[5]) ..
      ',"worker":' .. encoded(f[6] or '') .. ',"cause":' .. encoded(death) .. expired_tail)
  end
  local res, maxres = tonumber(f[3]) or 0, limit_of(f[4], death)
  local code = 2
  if f[5] == 'dying' or res >= maxres then
    redis.call('HSET', hash, 'state', 'dying', 'lease', ARGV[3], 'res_death', death)
  else
    code, fence = 1, fence + 1
    local cause, seen = cause_of(f[5], f[6], f[11], tonumber(deadline))
    if f[10] then  -- a re-lease: the recovery stays dated by its first lease
      redis.call('HSET', hash, 'fence', fence, 'state', 'queued', 'worker', '',
        'lease', ARGV[3], 'res_cause', cause, 'res_death', death)
    else
      redis.call('HSET', hash, 'fence', fence, 'state', 'queued', 'worker', '',
        'lease', ARGV[3], 'res_cause', cause, 'rc_cause', cause, 'rc_seen', seen,
        'rc_found', now_ms, 'res_death', death)
    end
  end
  -- Only a task whose every step succeeded is leased.
  leases[#leases + 1] = lease_until
  leases[#leases + 1] = id
  moved[id] = lease_until
  return {code, fence, f[2], res, f[7] or '', f[8] or '', f[9] or '', death}
end

local replies = {}
for i = first, #ARGV do
  local k = 2 * (i - first + 1)
  local ok, reply = pcall(resurrect, ARGV[i], deadlines[i], KEYS[k], KEYS[k + 1])
  if not ok then  -- a Redis error reply is a table {err = ...}, a Lua error a string
    reply = {-1, type(reply) == 'table' and tostring(reply.err) or tostring(reply)}
  end
  replies[#replies + 1] = reply
end
for at = 1, #leases, SLICE do
  redis.call('ZADD', KEYS[1], unpack(leases, at, math.min(at + SLICE - 1, #leases)))
end
return replies
