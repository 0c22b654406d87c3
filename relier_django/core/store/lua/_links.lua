-- _links.lua: not a script. scripts.py pastes it where a script says
-- '-- @include _links' (after _metrics and _limits): creating a task that another
-- task's ending brings about, Celery's link= (commit.lua: a callback) and link_error=
-- (dead_letter.lua: an errback). G1 across a link: the callback exists from the moment
-- its parent is committed (or the errback from the moment its parent is filed), in the
-- same script; G10: once only, a task id that already has a task or a result is left
-- alone, so a replay or a second filing creates nothing more.
--
-- The task is stored as push.lua stores a push due now: fence 1, 'scheduled' in the
-- schedule index due now (the scanner leader dispatches it, fenced, as any scheduled
-- task: G11), or, with a gate (model/limits.py Gate.script_arg), it takes a slot of its
-- scope first or waits parked in its key's line (G14). Unpartitioned stores only
-- (push refuses links on a partitioned one), as _limits.lua.
-- Returns 1 when it created the task, 0 when the id was taken already.
local function link_create(expiry_key, hash, result_key, id, env, name, queue, maxres, gate,
    now_ms, now_text, mkey)
  if redis.call('EXISTS', hash) == 1 or redis.call('EXISTS', result_key) == 1 then
    return 0
  end
  redis.call('HSET', hash,
    'env', env, 'fence', '1', 'state', 'queued', 'attempt', '1', 'res', '0',
    'name', name, 'queue', queue, 'idem', '', 'created_ms', now_text,
    'maxres', maxres, 'pushers', '1', 'due_ms', now_text)
  local prefix = limit_prefix(expiry_key)
  local scope, key, capacity = '', nil, nil
  if gate ~= '' then
    scope, key, capacity = limit_store_gate(hash, gate)
  end
  if scope == '' or limit_take_slot(prefix, hash, id, scope, key, capacity, '1', now_ms,
      mkey) then
    limit_schedule(prefix, hash, id, now_text)
  end
  metric_count(mkey, 'pushed')
  return 1
end
